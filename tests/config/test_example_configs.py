"""Every example config validates as the README's `--cfg` check does, on a machine without GPUs.

GPU configs are checked for everything but this machine's GPU count (``start_pipeline.py --cfg``); the
CPU configs must pass as they are. tests/e2e/test_example_configs_run.py runs each CPU one a step (or
names the end-to-end test that trains it).
"""

import json

import pytest
from example_configs import cpu_configs, example_configs, gpu_configs

from roll_ma.cli import main
from roll_ma.config import available_configs


def test_examples_hold_both_kinds_and_the_launcher_finds_every_one():
    assert cpu_configs() and gpu_configs()
    found = available_configs()
    for name, path in example_configs().items():
        assert found[name].resolve() == path.resolve(), f"{path}: another config is named {name!r} too"


@pytest.mark.parametrize("name", sorted(example_configs()))
def test_example_config_passes_the_cfg_check(name, capsys):
    assert main(["--config_name", name, "--cfg"]) == 0, capsys.readouterr().err
    out = capsys.readouterr()
    cfg = json.loads(out.out)
    assert cfg["name"] == name
    if name in gpu_configs():
        assert cfg["resources"]["num_gpus"] > 0
    else:  # a CPU config runs here as it is: the built-in model, no downloads
        assert cfg["resources"]["num_gpus"] == 0 and cfg["model"]["path"].startswith("builtin:")
        assert "note:" not in out.err
