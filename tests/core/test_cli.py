"""The launcher: options anywhere among the overrides; one working fix for a GPU config on a CPU machine."""

from __future__ import annotations

import json
import shlex

import pytest
from example_configs import gpu_configs

import roll_ma.config.validate as validate_module
from roll_ma.cli import main
from roll_ma.config import ConfigError, load_config


@pytest.mark.parametrize("argv", [
    ["--config_name", "math_selfplay_tiny", "trainer.max_steps=3", "--cfg"],
    ["trainer.max_steps=3", "--cfg", "--config_name", "math_selfplay_tiny", "env.group_size=2"],
    ["-cn", "math_selfplay_tiny", "env.group_size=2", "--lora_rank", "4", "trainer.max_steps=3", "--cfg"],
])
def test_options_may_come_anywhere_among_the_overrides(argv, capsys):
    assert main(argv) == 0, capsys.readouterr().err
    cfg = json.loads(capsys.readouterr().out)
    assert cfg["name"] == "math_selfplay_tiny" and cfg["trainer"]["max_steps"] == 3
    if "env.group_size=2" in argv:
        assert cfg["env"]["group_size"] == 2
    if "--lora_rank" in argv:
        assert cfg["lora"]["rank"] == 4


def _advised_overrides(message: str) -> list[str]:
    """The overrides the resources.num_gpus problem tells a user to add, as the shell would pass them."""
    advice = message.split("with the overrides: ", 1)[1].split(" (slow", 1)[0].split(";", 1)[0]
    return shlex.split(advice)


@pytest.mark.parametrize("name", gpu_configs())
def test_a_gpu_config_on_a_cpu_machine_gets_one_list_of_overrides_that_works(name, monkeypatch, capsys):
    monkeypatch.setattr(validate_module, "local_gpu_count", lambda: 0)
    assert main(["--config_name", name]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = [ln for ln in err.splitlines() if "resources.num_gpus:" in ln]
    assert ("this machine has none. Run it on a cluster (RAY_ADDRESS=<head>:6379), or on this machine's CPU "
            "with the overrides: resources.num_gpus=0 '~resources.device_mapping'") in line
    overrides = _advised_overrides(line)
    assert overrides[0] == "resources.num_gpus=0"
    cfg = load_config(name, overrides=overrides)  # following the advice: the config is valid on this machine
    assert cfg.resources.num_gpus == 0 and cfg.resources.device_mapping == {}
    # --cfg (which checks a GPU config anywhere) gives the same advice, never another fix
    assert main(["--config_name", name, "--cfg"]) == 0
    note = capsys.readouterr().err
    assert note.strip() == f"note: config {name!r} is valid and " + line.split("resources.num_gpus: ", 1)[1]


def test_the_advice_for_a_smaller_gpu_machine_uses_its_gpus(monkeypatch):
    monkeypatch.setattr(validate_module, "local_gpu_count", lambda: 1)
    with pytest.raises(ConfigError) as err:
        load_config("math_reflection_7b")
    (problem,) = err.value.problems
    assert problem.key == "resources.num_gpus"
    assert problem.message.startswith("asks for 2 GPUs but this machine has 1. Run it on a cluster")
    overrides = _advised_overrides(problem.message)
    assert overrides == ["resources.num_gpus=1", "~resources.device_mapping"]
    assert load_config("math_reflection_7b", overrides=overrides).resources.num_gpus == 1


def test_a_mapping_left_behind_on_cpu_names_the_same_override(monkeypatch):
    monkeypatch.setattr(validate_module, "local_gpu_count", lambda: 0)
    with pytest.raises(ConfigError) as err:
        load_config("math_selfplay_7b", overrides=["resources.num_gpus=0"])
    (problem,) = err.value.problems
    assert problem.key == "resources.device_mapping"
    assert problem.message == ("maps roles onto GPUs [0] but resources.num_gpus=0: to run on CPU drop the "
                               "mapping too ('~resources.device_mapping'); to run on GPUs set "
                               "resources.num_gpus=1")
