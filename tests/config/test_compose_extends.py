"""A user's own yaml extends a shipped config by name (``defaults: [math_selfplay_tiny, _self_]``): it
composes from any folder, under the user's own run name (never the shipped config's outputs/), and a
misspelled shipped name is refused with the closest one."""

from __future__ import annotations

import pytest

from roll_ma.config import ConfigError
from roll_ma.config.compose import compose_raw
from roll_ma.preflight.config_loader import load_config


def _mine(folder, text: str) -> str:
    (folder / "mine.yaml").write_text(text)
    return str(folder)


def test_a_user_yaml_extends_a_shipped_config_under_its_own_name(tmp_path):
    folder = _mine(tmp_path, "defaults:\n  - math_selfplay_tiny\n  - _self_\ntrainer:\n  max_steps: 3\n")
    raw = compose_raw("mine", folder, ["trainer.eval_every=2"])
    shipped = compose_raw("math_selfplay_tiny", None, [])
    # the shipped config's settings, then the user's, then the command line's
    assert raw["env"] == shipped["env"] and raw["agents"] == shipped["agents"]
    assert raw["trainer"]["max_steps"] == 3 and raw["trainer"]["eval_every"] == 2
    assert raw["name"] == "mine" and raw["trainer"]["output_dir"] == "outputs/mine"


@pytest.mark.parametrize(
    "own, overrides, name",
    [("name: my_run\n", [], "my_run"), ("", ["name=from_cli"], "from_cli"),
     ("name: my_run\n", ["name=cli"], "cli")],
    ids=["yaml", "cli", "cli-over-yaml"],
)
def test_a_name_given_by_the_user_is_kept(tmp_path, own, overrides, name):
    folder = _mine(tmp_path, f"defaults:\n  - math_selfplay_tiny\n  - _self_\n{own}")
    raw = compose_raw("mine", folder, overrides)
    assert raw["name"] == name and raw["trainer"]["output_dir"] == f"outputs/{name}"


def test_the_extended_config_is_typed_and_checked_like_a_shipped_one(tmp_path):
    folder = _mine(tmp_path, "defaults:\n  - math_selfplay_tiny\n  - _self_\nenv:\n  group_size: 2\n")
    cfg = load_config("mine", folder, [])
    assert cfg.name == "mine" and cfg.env.group_size == 2 and cfg.env.name == "math_selfplay"
    with pytest.raises(ConfigError, match="env.group_sise"):
        load_config("mine", folder, ["env.group_sise=3"])


def test_a_misspelled_shipped_config_is_refused_with_the_closest_shipped_name(tmp_path):
    folder = _mine(tmp_path, "defaults:\n  - math_selfplay_tinyy\n  - _self_\n")
    with pytest.raises(ConfigError) as refused:
        compose_raw("mine", folder, [])
    problem = refused.value.problems[0]
    assert problem.key == f"{tmp_path / 'mine.yaml'}:2"
    assert "did you mean 'math_selfplay_tiny'?" in problem.message, problem.message
