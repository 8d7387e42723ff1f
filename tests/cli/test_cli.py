"""The launcher: options anywhere among the overrides; one working fix for a GPU config on a CPU machine."""

from __future__ import annotations

import json
import shlex

import pytest
from example_configs import gpu_configs

import roll_ma.preflight.validate as validate_module
from roll_ma.cli import main
from roll_ma.config import ConfigError
from roll_ma.preflight.config_loader import load_config


@pytest.fixture(autouse=True)
def own_folder(tmp_path, monkeypatch):
    """Each test in a folder of its own: --cfg runs the pre-flight checks, and the demo's outputs/ in the
    checkout (README's first command, at the configs' default trainer.output_dir) would be checked too."""
    monkeypatch.chdir(tmp_path)


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
    # --cfg (which checks a GPU config anywhere) gives the same advice, never another fix, and says which
    # checks it skipped: those of the machine the run starts on
    assert main(["--config_name", name, "--cfg"]) == 0
    note, skipped = capsys.readouterr().err.strip().splitlines()
    assert note == f"note: config {name!r} is valid and " + line.split("resources.num_gpus: ", 1)[1]
    assert skipped.startswith("note: the pre-flight checks (model and tokenizer, data files, checkpoint, "
                              "hooks, Ray auth) were skipped")


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


def test_cfg_job_prints_the_runs_config_as_yaml_that_runs_as_it_is(tmp_path, capsys):
    import yaml

    assert main(["--config_name", "math_selfplay_tiny", "--cfg", "job", "trainer.max_steps=3"]) == 0
    out = capsys.readouterr().out
    assert yaml.safe_load(out)["trainer"]["max_steps"] == 3 and "hydra" not in yaml.safe_load(out)
    (tmp_path / "mine.yaml").write_text(out)  # what a Hydra user does with it
    again = load_config("mine", config_path=str(tmp_path))
    assert again == load_config("math_selfplay_tiny", overrides=["trainer.max_steps=3"])


def test_cfg_hydra_says_what_roll_ma_has_instead_and_all_prints_both(capsys):
    import yaml

    argv = ["-cn", "math_selfplay_tiny", "env.group_size=2"]
    assert main([*argv, "--cfg", "hydra"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# roll_ma composes configs with Hydra but runs without Hydra's launcher")
    launcher = yaml.safe_load(out)
    assert list(launcher) == ["hydra"]
    assert launcher["hydra"]["overrides"] == ["env.group_size=2"]
    assert launcher["hydra"]["output_dir"] == "outputs/math_selfplay_tiny"
    assert launcher["hydra"]["config_file"].endswith("math_selfplay_tiny.yaml")
    assert main([*argv, "-c", "all"]) == 0
    both = yaml.safe_load(capsys.readouterr().out)
    assert both["hydra"] == launcher["hydra"] and both["env"]["group_size"] == 2


def test_bare_cfg_keeps_printing_json_and_never_takes_an_override_for_its_value(capsys):
    assert main(["--config_name", "math_selfplay_tiny", "--cfg", "trainer.max_steps=3"]) == 0
    assert json.loads(capsys.readouterr().out)["trainer"]["max_steps"] == 3
    assert main(["--config_name", "math_selfplay_tiny", "--cfg=job"]) == 0
    assert capsys.readouterr().out.startswith("name: math_selfplay_tiny\n")


def test_cfg_with_an_unknown_part_names_the_parts(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--config_name", "math_selfplay_tiny", "--cfg=jobs"])
    assert exit_.value.code == 2
    assert "--cfg takes job, hydra or all (or nothing: JSON), got 'jobs'" in capsys.readouterr().err


@pytest.mark.parametrize("part", [[], ["job"]])
def test_cfg_runs_the_checks_a_run_makes_and_lists_four_bad_data_rows(tmp_path, capsys, part, no_ray):
    """The config is printed (a Hydra user may save it), then the problems; the exit code says the run
    would be refused."""
    rows = [
        {"role": "actor", "prompt": "1+1?", "completion": "2"},
        {"role": "actor", "prompt": "2+2?", "completion": ""},
        {"role": "judge", "prompt": "2+2?", "completion": "4"},
        {"role": "critic", "messages": [{"role": "user", "content": None}, {"role": "assistant",
                                                                             "content": "ok"}]},
        {"role": "actor", "prompt": "3+3?"},
    ]
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "bad_rows.yaml").write_text(
        "name: bad_rows\nmodel: {path: 'builtin:tiny', max_prompt_tokens: 64}\n"
        "agents: [{name: actor}, {name: critic}]\nenv: {name: math_reflection, max_rounds: 2}\n"
        f"train: {{objective: sft}}\nsft: {{source: file, path: {data}}}\n"
        f"trainer: {{output_dir: {tmp_path / 'out'}}}\n")
    code = main(["--config_path", str(tmp_path), "--config_name", "bad_rows", "--cfg", *part])
    out, err = capsys.readouterr()
    assert code == 2
    assert "bad_rows" in out  # the config came first
    assert f"the run cannot start (4 problems):\n  - {data}:2: completion: is empty" in err
    assert f"{data}:3: role: 'judge' is not an agent of this run" in err
    assert f"{data}:4: messages[0].content: is null (no text)" in err
    assert f"{data}:5: completion: missing" in err
