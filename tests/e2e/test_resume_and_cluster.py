"""Crash safety and deployment: kill -9 mid-run and resume; bad configs stop early. (A run on a Ray head node
someone started: tests/e2e/test_multi_node.py.)"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pipeline_helpers import (
    REPO,
    TOY_AGENTS,
    TOY_STEPS,
    adapter_tensors_at,
    load,
    same_tensors,
    steps_logged,
    toy_config,
    write_config,
)

from roll_ma.errors import PreflightError
from roll_ma.pipelines import run_training

pytestmark = pytest.mark.slow
AGENTS = TOY_AGENTS


def _launch(config_dir: Path, *overrides: str, env: dict | None = None) -> subprocess.Popen:
    cmd = [
        sys.executable,
        str(REPO / "start_pipeline.py"),
        "--config_path",
        str(config_dir),
        "--config_name",
        "toy",
        *overrides,
    ]
    # its own process group: kill -9 must take the driver and the Ray processes it started
    return subprocess.Popen(
        cmd,
        cwd=REPO,
        env={**os.environ, **(env or {})},
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _kill_after_step(proc: subprocess.Popen, step: int, delay: float) -> None:
    """SIGKILL the run (driver and its Ray processes) ``delay`` s after it printed step ``step``'s summary.

    The driver prints a step's summary after writing its metrics line and before its checkpoint, so
    delay 0 kills between the two, and a short delay lands inside the next step.
    """
    # Ray forwards the workers' progress bars into the same pipe, so a summary line can arrive behind a
    # bar's cursor-up escape ("\x1b[Astep 2/4  step=...") instead of at the start of the line
    summary = re.compile(rf"(?:^|[\r\x1b]\[?A?)step {step}/\d+ ")
    seen = []
    for line in proc.stdout:  # the driver's own output: the event to act on, no polling
        seen.append(line)
        if summary.search(line):
            break
    else:
        pytest.fail(f"the run ended before step {step}:\n{''.join(seen)}")
    time.sleep(delay)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_kill9_at_any_moment_then_resume_logs_each_step_once_and_ends_identical(toy_run, tiny_model_dir,
                                                                                 tmp_path):
    steps, ref_out = TOY_STEPS, toy_run  # the uninterrupted reference run, in this process (conftest.py)
    cfg = toy_config(tmp_path, tiny_model_dir, AGENTS, trainer={"max_steps": steps, "resume": "auto"})
    config_dir, out = write_config(tmp_path, cfg), tmp_path / "out"
    # killed right after a step is logged (before its checkpoint), then in the middle of a later step (a toy
    # step takes 0.1-0.2 s here)
    _kill_after_step(_launch(config_dir), step=2, delay=0.0)
    _kill_after_step(_launch(config_dir), step=3, delay=0.05)
    final = _launch(config_dir)
    log, _ = final.communicate(timeout=600)
    assert final.returncode == 0, log
    # resumed; or, where the second run was slower to die than its last steps took, told it is done
    assert "resumed from" in log or "step 5 of 5 already done" in log, log
    assert steps_logged(out) == list(range(1, steps + 1)), "every step exactly once"
    # same seed, same episodes, same updates: the adapters end bit for bit as in the uninterrupted run
    for adapter in ("alice", "bob"):
        assert same_tensors(
            adapter_tensors_at(out, steps, adapter), adapter_tensors_at(ref_out, steps, adapter)
        )
    assert not list((out / "checkpoints").glob(".tmp_*")), "half-written checkpoints are cleaned up"


def test_resume_skips_a_damaged_newest_checkpoint_and_says_which(toy_run, tiny_model_dir, tmp_path, capsys):
    steps, out = TOY_STEPS, tmp_path / "out"
    shutil.copytree(toy_run, out)  # the shared run's checkpoints 1..TOY_STEPS, to damage here
    # the checkpoint records its config: another LoRA rank is refused before anything loads
    with pytest.raises(PreflightError, match=r"lora.rank: 4 in the checkpoint, 8 now \(adapters alice, bob"):
        run_training(load(tmp_path, toy_config(tmp_path, tiny_model_dir, AGENTS, lora={"rank": 8})))
    rel = "trainer/adapters/alice/adapter_model.safetensors"
    damaged = out / "checkpoints" / f"step_{steps:06d}" / rel
    size = damaged.stat().st_size
    with open(damaged, "r+b") as f:  # a disk that filled up, a copy that was cut short
        f.truncate(size // 2)
    capsys.readouterr()

    # before: the train worker's SafetensorError traceback ended the resumed run
    cfg = toy_config(tmp_path, tiny_model_dir, AGENTS, trainer={"max_steps": steps + 1})
    run_training(load(tmp_path, cfg))
    log = capsys.readouterr().out
    assert (
        f"[roll_ma] skipped the damaged checkpoint step_{steps:06d}: {rel} is {size // 2:,} bytes, "
        f"the manifest says {size:,}"
    ) in log, log
    previous = out / "checkpoints" / f"step_{steps - 1:06d}"
    assert f"resumed from {previous} (step {steps - 1})" in log, log
    assert steps_logged(out) == list(range(1, steps + 2)), "the last 2 steps ran again, each logged once"
    assert (out / "checkpoints" / f"damaged_step_{steps:06d}").is_dir()  # kept for a look, never resumed from


def test_bad_config_is_refused_before_ray_or_any_actor(tiny_model_dir, tmp_path):
    cfg = toy_config(tmp_path, tiny_model_dir, AGENTS)
    # an unreachable RAY_ADDRESS: had the launcher touched Ray, it would fail on the connection instead
    run = _launch(
        write_config(tmp_path, cfg),
        "env.seats=[alice,carol]",
        "train.lr=fast",
        env={"RAY_ADDRESS": "127.0.0.1:1"},
    )
    log, _ = run.communicate(timeout=120)
    assert run.returncode == 2
    assert "env.seats[1]: 'carol' is not an agent" in log and "train.lr: must be a number" in log
    assert "Traceback" not in log and "[roll_ma]" not in log and not (tmp_path / "out").exists()


def test_async_run_killed_with_a_rollout_in_flight_resumes_each_step_once(tiny_model_dir, tmp_path):
    """max_staleness=1: a kill lands while the next step's rollout plays; the resumed run regenerates that
    rollout's episodes (the checkpoint keeps the planner from before them) and logs every step once."""
    steps = 4
    cfg = toy_config(tmp_path, tiny_model_dir, AGENTS, trainer={"max_steps": steps, "resume": "auto"},
                     rollout={"max_staleness": 1})
    config_dir, out = write_config(tmp_path, cfg), tmp_path / "out"
    _kill_after_step(_launch(config_dir), step=2, delay=0.05)  # inside step 3's update (0.1-0.2 s a step)
    final = _launch(config_dir)
    log, _ = final.communicate(timeout=600)
    assert final.returncode == 0, log
    assert "resumed from" in log or f"step {steps} of {steps} already done" in log, log
    assert steps_logged(out) == list(range(1, steps + 1)), "every step exactly once"
