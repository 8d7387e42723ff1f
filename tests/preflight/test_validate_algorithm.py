"""The algorithm block's names are checked before any actor starts, each under its own key."""

from roll_ma.config.schema import AlgorithmConfig
from roll_ma.preflight.validate_algorithm import unknown_algorithm_names


def test_the_preflight_check_names_each_unknown_key():
    assert unknown_algorithm_names(AlgorithmConfig()) == []
    assert unknown_algorithm_names(AlgorithmConfig(advantage="gae")) == []
    problems = unknown_algorithm_names(AlgorithmConfig(advantage="nope", policy_loss="nope"))
    assert [key for key, _ in problems] == ["algorithm.advantage", "algorithm.policy_loss"]
    assert all("'nope'" in why and "registered:" in why for _, why in problems)
