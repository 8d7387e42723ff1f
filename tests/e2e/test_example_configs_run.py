"""Every CPU example config runs one step through the launcher the README uses (start_pipeline.py's main).

The configs are found by globbing examples/ (tests/helpers/example_configs.py), so a new CPU yaml is run here
without a test edit. The overrides only shrink the work (one step, small groups, few eval problems, short
phases) and send the outputs to tmp_path; every other key is the config's own. One Ray for all of them.
A config that another end-to-end test already trains, with its own keys and more asserts, runs there only.
"""

import time
from pathlib import Path

import pytest
from example_configs import cpu_configs

from roll_ma.cli import main
from roll_ma.tracking import read_metrics

TESTS = Path(__file__).resolve().parents[1]
# config -> the end-to-end test that trains it (a second one-step run of the same config adds nothing)
RUN_ELSEWHERE = {
    "marft_tiny": "e2e/test_marft_e2e.py",
    "tiny_hanabi_selfplay": "e2e/test_pipeline_e2e.py",
    "code_tests_tiny": "workflows/test_workflow_examples.py",
    "math_tool_tiny": "workflows/test_workflow_examples.py",
}

ONE_STEP = [
    "trainer.max_steps=1",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "trainer.progress_bars=false",
    "env.groups_per_step=2",
    "env.group_size=2",
    "env.eval_episodes=4",
    "env.data.num_eval_problems=4",
    # phase configs (sft / dpo chains): the smallest phase of each kind
    "sft.problems=2",
    "sft.samples_per_problem=1",
    "sft.max_steps=1",
    "dpo.iterations=1",
    "dpo.problems_per_iteration=2",
    "dpo.steps_per_iteration=1",
]


def test_the_configs_run_elsewhere_are_trained_there():
    for name, test_file in RUN_ELSEWHERE.items():
        assert name in cpu_configs(), f"{name} is no CPU example config any more"
        assert f'"{name}"' in (TESTS / test_file).read_text(), f"{test_file} no longer runs {name}"


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in cpu_configs() if n not in RUN_ELSEWHERE])
def test_cpu_example_config_runs_one_step(name, ray_session, tmp_path, capsys):
    out = tmp_path / name
    start = time.perf_counter()
    rc = main(["--config_name", name, *ONE_STEP, f"trainer.output_dir={out}"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err[-3000:]
    assert "[roll_ma] done: " in printed.out and "metrics " in printed.out
    rows = read_metrics(out / "metrics.jsonl")
    assert rows, f"{name}: no metrics written"
    assert (out / "checkpoints").is_dir()
    with capsys.disabled():
        print(f"\n{name}: one step in {time.perf_counter() - start:.1f} s")
