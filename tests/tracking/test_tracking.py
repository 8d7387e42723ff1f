"""metrics.jsonl: one line per step, whatever logs into a step; a fresh run that replaces an earlier run's
metrics says so."""

from __future__ import annotations

from roll_ma.config.schema import TrackingConfig
from roll_ma.tracking import Tracker, read_metrics

SINKS = TrackingConfig(tensorboard=False, wandb=False)


def test_metrics_logged_again_for_a_step_join_its_line(tmp_path):
    tracker = Tracker(tmp_path, SINKS, "run", {})
    tracker.log({"eval/score": 0.5}, step=0)
    tracker.log({"agent/a/loss": 1.0}, step=1)
    tracker.log({"timing/phase/sft": 3.0, "agent/a/loss": 0.9}, step=1)  # after the step: the same line
    tracker.log({"agent/a/loss": 0.8}, step=2)
    tracker.close()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[1]["agent/a/loss"] == 0.9 and rows[1]["timing/phase/sft"] == 3.0
    assert list(rows[1])[:2] == ["step", "wall_time"]
    assert not (tmp_path / "metrics.jsonl.tmp").exists()


def test_a_resumed_run_continues_the_line_of_its_checkpoint_step(tmp_path):
    tracker = Tracker(tmp_path, SINKS, "run", {})
    for step in (1, 2, 3):
        tracker.log({"x": float(step)}, step)
    tracker.close()
    resumed = Tracker(tmp_path, SINKS, "run", {}, resume_step=2)  # step 3 is dropped, step 2 kept
    resumed.log({"eval/score": 1.0}, step=2)
    resumed.log({"x": 3.5}, step=3)
    resumed.close()
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["x"]) for r in rows] == [(1, 1.0), (2, 2.0), (3, 3.5)]
    assert rows[1]["eval/score"] == 1.0


def test_a_fresh_run_over_earlier_metrics_says_it_replaces_them(tmp_path, capsys):
    tracker = Tracker(tmp_path, SINKS, "run", {})
    tracker.log({"x": 1.0}, step=1)
    tracker.close()
    Tracker(tmp_path, SINKS, "run", {}).close()
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "held 1 line of an earlier run" in out and "replaces them" in out
    assert read_metrics(tmp_path / "metrics.jsonl") == []
    Tracker(tmp_path, SINKS, "run", {}).close()  # nothing to replace: nothing said
    assert capsys.readouterr().out == ""
