"""The algorithm block's names are checked before any actor starts, each under its own key."""

from roll_ma.config.schema import AlgorithmConfig
from roll_ma.preflight.validate_algorithm import unknown_algorithm_names


def test_the_preflight_check_names_each_unknown_key():
    assert unknown_algorithm_names(AlgorithmConfig()) == []
    assert unknown_algorithm_names(AlgorithmConfig(advantage="gae")) == []
    problems = unknown_algorithm_names(AlgorithmConfig(advantage="nope", policy_loss="nope"))
    assert [key for key, _ in problems] == ["algorithm.advantage", "algorithm.policy_loss"]
    assert all("'nope'" in why and "registered:" in why for _, why in problems)


USER_ALGOS = '''
def sign_of_return(returns, rows, algo):
    return returns


def doubled_pg(log_probs, old_log_probs, advantages, mask, algo, denominator, weights):
    return log_probs.sum(), {}

NOT_A_FUNCTION = 3
'''


def test_a_spec_naming_a_users_file_resolves_or_says_what_is_wrong_under_its_key(tmp_path, monkeypatch):
    import pytest

    from roll_ma.config import ConfigError
    from roll_ma.preflight.config_loader import load_config

    (tmp_path / "my_algos.py").write_text(USER_ALGOS)
    monkeypatch.chdir(tmp_path)  # a relative file is looked up from where the run starts
    spec = ["algorithm.advantage=my_algos.py:sign_of_return", "algorithm.policy_loss=my_algos.py:doubled_pg"]
    cfg = load_config("tiny_hanabi_selfplay", overrides=spec)
    assert cfg.algorithm.policy_loss == "my_algos.py:doubled_pg"
    for override, words in (
        ("algorithm.policy_loss=nope.py:doubled_pg", r"algorithm.policy_loss.*no file 'nope.py'"),
        ("algorithm.policy_loss=my_algos.py:doubled", r"algorithm.policy_loss.*has no 'doubled'.*doubled_pg"),
        ("algorithm.policy_loss=my_algos.py:sign_of_return",
         r"algorithm.policy_loss.*is no policy loss: it must take \(log_probs, old_log_probs"),
        ("algorithm.advantage=my_algos.py:NOT_A_FUNCTION",
         r"algorithm.advantage.*NOT_A_FUNCTION in .* is an int, not a function"),
        ("algorithm.advantage=no_such_pkg.algos:f",
         r"algorithm.advantage.*cannot import .no_such_pkg.* put its folder on PYTHONPATH"),
    ):
        with pytest.raises(ConfigError, match=words):
            load_config("tiny_hanabi_selfplay", overrides=[override])
