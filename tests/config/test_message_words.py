"""Refusals in the user's words. Every ConfigError and PreflightError raised in the validation and pre-flight
suites is checked by tests/helpers/message_words.py (through tests/conftest.py); here: the check itself, and a
table of bad configs whose messages once named variables from inside the code."""

from __future__ import annotations

import pytest

from roll_ma.config import ConfigError
from roll_ma.preflight.config_loader import load_config


def problems_of(name, overrides):
    with pytest.raises(ConfigError) as err:
        load_config(name, overrides=list(overrides))
    return [str(p) for p in err.value.problems]


def test_the_check_flags_words_from_inside_the_code_and_passes_the_users(refusals_in_user_words):
    words = refusals_in_user_words
    load_config("math_selfplay_tiny", overrides=["agents.2.name=my_fixer", "agents.2.kind=refiner"])
    assert words.inside_words("env.seats: role 'my_fixer' has kind 'x'; set role_kinds['my_fixer'] to "
                              "solver") == ["role_kinds['my_fixer']"]
    assert words.inside_words("seat_agents ['a'] must equal the distinct roles ['b']") == ["seat_agents"]
    assert words.inside_words("cfg.env.kwargs is wrong") == ["cfg.env.kwargs"]
    assert words.inside_words(
        "agents[2].kind: is unset, so agent 'my_fixer' has its name as kind; set agents[2].kind, "
        "env.kwargs.role_kinds.my_fixer or --config_name (e.g. HF_HUB_OFFLINE=1, tokenizer_config.json, "
        "max_position_embeddings, the *_tiny configs); trainer.nope: valid keys here: keep_last, log_every; "
        "/tmp/some_dir/run_1.jsonl:3: messages[0].content: is null") == []


@pytest.mark.parametrize("name, overrides, expected", [
    # an agent whose kind the role-based env does not know: the key to set, not the env's argument
    ("math_selfplay_tiny", ["agents.2.name=fixer"],
     ["agents[2].kind: is unset, so agent 'fixer' has its name as kind; math_selfplay knows the kinds "
      "solver, critic, refiner: set agents[2].kind to one of them"]),
    ("math_selfplay_tiny", ["agents.2.kind=fixer"],
     ["agents[2].kind: is 'fixer'; math_selfplay knows the kinds solver, critic, refiner: set agents[2].kind "
      "to one of them"]),
    # seats that do not match the roles: the env's own words, about seats and roles
    ("math_selfplay_tiny",
     ["env.kwargs.roles=[solver,critic,refiner,critic]", "env.seats=[solver,refiner,critic]"],
     ["env.seats: math_selfplay rejected the seats ['solver', 'refiner', 'critic']: the seats ['solver', "
      "'refiner', 'critic'] must be the distinct roles in turn order, ['solver', 'critic', 'refiner']"]),
    ("math_reflection_tiny", ["+env.kwargs.roles=[actor,critic]", "env.seats=[critic,actor]"],
     ["env.seats: math_reflection rejected the seats ['critic', 'actor']: the seats ['critic', 'actor'] must "
      "be the roles ['actor', 'critic'] (actor, then critic)"]),
    # one cause, one message: the env is not built again to reject the same setting in its own words
    ("math_selfplay_tiny", ["env.show_greedy_moves=true"],
     ["env.show_greedy_moves: math_selfplay does not show other players' greedy moves (SAD); envs that do: "
      "tiny_hanabi"]),
    ("tiny_hanabi_selfplay", ["study.joint_search_every=10", "env.name=kuhn_poker"],
     ["study.joint_search_every: joint search needs a common-payoff game; kuhn_poker is zero-sum"]),
])
def test_refusals_once_in_code_words(name, overrides, expected):
    assert problems_of(name, overrides) == expected
