"""The streamed RL step (``rollout.max_staleness = k >= 1``): step s + 1's episodes play against the
engines while step s trains, and each agent's adapter goes out to the engines as soon as its own update
ends.

Its stages, in order: rollout (mostly played already; the next step's is launched at once), drop the
rows more than k versions old (the rest train with the decoupled objective), score, advantages,
update-and-stream (agent after agent: update, push, go on), evaluation, record. The synchronous step is
``step.py``; ``loop.py`` picks one of the two when the run starts.
"""

from __future__ import annotations

from typing import Any

from roll_ma.algorithms.staleness import drop_stale_rows
from roll_ma.pipelines.rl.rl_run import RLRun
from roll_ma.pipelines.rl.stages import (
    compute_advantages,
    evaluate_if_due,
    free_engine_memory,
    record,
    roll_out,
    score,
    update_request,
)
from roll_ma.pipelines.step_timer import StepTimer
from roll_ma.protocol import DataProto


def streamed_step(run: RLRun, step: int) -> dict[str, Any]:
    """One step: its stages one after another; returns the step's metrics (logged by ``record``)."""
    timer = StepTimer()
    with timer("step"):
        batch, metrics = roll_out(run, step, timer)
        if step < run.cfg.trainer.max_steps:
            run.rollouts.launch(step + 1)  # the next step's episodes play from now on
        batch, dropped = drop_too_stale(run, batch)
        metrics.update(dropped)
        metrics.update(free_engine_memory(run, timer))
        batch, scored, flops = score(run, batch, step, timer)
        metrics.update(scored)
        batch, advantaged = compute_advantages(run, batch, step, timer)
        metrics.update(advantaged)
        request = update_request(run, step, behavior_correction=True)  # rows of older adapters: decoupled
        streamed, changed = run.sync.stream(batch, request, run.train_order, step, timer)
        metrics.update(streamed)
        run.mark_served(changed, step)
        metrics.update(evaluate_if_due(run, step, timer))
    return record(run, step, metrics, timer, flops, rollout_s=rollout_wall_s(metrics))


def drop_too_stale(run: RLRun, batch: DataProto) -> tuple[DataProto, dict[str, float]]:
    """Rows more than ``rollout.max_staleness`` versions old are not trained on; the rest train with the
    decoupled objective (``UpdateRequest.behavior_correction``: pi_old / pi_rollout weights,
    objective_ppo.py)."""
    return drop_stale_rows(batch, run.agent_names, run.adapter_of_agent, run.served,
                           run.cfg.rollout.max_staleness)


def rollout_wall_s(metrics: dict[str, Any]) -> float:
    """The rollout's own wall clock (timing/rollout is only the trainer's wait for what was left of it)."""
    return metrics.get("timeline/rollout_end", 0) - metrics.get("timeline/rollout_start", 0)
