"""The evaluation before the first step (step 0) is logged as metrics.jsonl's step 0 and printed."""

from __future__ import annotations

import types

from roll_ma.config.schema import TrackingConfig
from roll_ma.pipelines.rl import loop
from roll_ma.pipelines.step_timer import StepTimer
from roll_ma.tracking import Tracker, read_metrics

EVAL = {"eval/pass1@turn1": 0.46, "eval/critic_accuracy": 0.555, "eval/num_episodes": 200.0}


def _run(tmp_path, eval_every: int, start_step: int = 0) -> types.SimpleNamespace:
    cfg = types.SimpleNamespace(trainer=types.SimpleNamespace(eval_every=eval_every, max_steps=4),
                                env=types.SimpleNamespace(eval_opponent="random"))
    tracker = Tracker(tmp_path, TrackingConfig(tensorboard=False, wandb=False), "run", {})
    session = types.SimpleNamespace(start_step=start_step, startup=StepTimer("startup"),
                                    planner=None, seats=["solver", "critic"], tracker=tracker)
    return types.SimpleNamespace(cfg=cfg, session=session, workers=None)


def test_the_step_0_evaluation_is_printed_and_logged(tmp_path, monkeypatch, capsys):
    # the workers' part (evaluate plays the episodes) is what the end-to-end tests run; here: what is shown
    monkeypatch.setattr(loop, "evaluate", lambda workers, planner, seats, opp, step: EVAL)
    run = _run(tmp_path, eval_every=2)
    loop.evaluate_before_training(run)
    run.session.tracker.close()
    assert capsys.readouterr().out.splitlines() == [
        "step 0/4  evaluation of the initial adapters",
        "  eval: critic_accuracy=0.555  num_episodes=200  pass1@turn1=0.46",
    ]
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["eval/pass1@turn1"]) for r in rows] == [(0, 0.46)]


def test_no_step_0_evaluation_without_eval_every_or_on_resume(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(loop, "evaluate", lambda *a: EVAL)
    for run in (_run(tmp_path / "off", eval_every=0), _run(tmp_path / "resumed", eval_every=2, start_step=2)):
        loop.evaluate_before_training(run)
        run.session.tracker.close()
    assert capsys.readouterr().out == ""


def test_the_last_lines_set_the_first_and_last_evaluation_the_run_logged_side_by_side(tmp_path):
    tracker = Tracker(tmp_path, TrackingConfig(tensorboard=False, wandb=False), "run", {})
    tracker.log(EVAL, step=0)
    tracker.log({"train/loss": 0.3}, step=1)
    tracker.log({**EVAL, "eval/pass1@turn1": 0.645, "eval/critic_accuracy": 0.59}, step=2)
    tracker.close()
    session = types.SimpleNamespace(out_dir=tmp_path, saved=None)
    done = f"[roll_ma] done: no checkpoint, metrics {tmp_path / 'metrics.jsonl'}"
    assert loop.last_lines(session, None) == [
        "[roll_ma] evaluation, step 0 -> 2: critic_accuracy 0.555 -> 0.59, pass1@turn1 0.46 -> 0.645", done]
    (tmp_path / "metrics.jsonl").write_text("")  # no evaluation: only where the files are
    assert loop.last_lines(session, None) == [done]
