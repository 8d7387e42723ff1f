"""The synchronous RL step (``rollout.max_staleness=0``): roll out with the newest adapters, then train on
the rows, then push the updated adapters before the next rollout starts.

Its stages, in order: rollout (every row must report its agent's newest adapter version), score
(reference and old log-probs, the critic's values), advantages, update (agent after agent), sync,
evaluation, record. The joint-search step (a study's: ``roll_ma/studies/joint_search_step.py``) is this
step with one more stage between the update and the sync.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from roll_ma.metrics import update_mfu_metrics
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
from roll_ma.protocol.requests import UpdateRequest, UpdateResult

STALE_ERROR = (
    "the rollout used a stale adapter ({rows} rows did not use the version pushed after the last "
    "update); this is a bug in the adapter sync, not in your config"
)


def synchronous_step(run: RLRun, step: int) -> dict[str, Any]:
    """One step: its stages one after another; returns the step's metrics (logged by ``record``)."""
    timer = StepTimer()
    with timer("step"):
        metrics, flops, trained = roll_out_and_update(run, step, timer)
        push_and_evaluate(run, set(trained.updated_adapters), step, metrics, timer)
    return record(run, step, metrics, timer, flops, rollout_s=timer.times["timing/rollout"])


def roll_out_and_update(run: RLRun, step: int, timer: StepTimer
                        ) -> tuple[dict[str, Any], dict[str, float], UpdateResult]:
    """The step up to its update: rollout, score, advantages, update. Returns the step's metrics so far
    (the update's among them), each scoring pass's FLOPs and what the update did."""
    batch, metrics = roll_out(run, step, timer)
    refuse_stale_rows(metrics)
    metrics.update(free_engine_memory(run, timer))
    batch, scored, flops = score(run, batch, step, timer)
    metrics.update(scored)
    batch, advantaged = compute_advantages(run, batch, step, timer)
    metrics.update(advantaged)
    trained = update(run, batch, update_request(run, step, behavior_correction=False), timer)
    metrics.update(trained.metrics)
    return metrics, flops, trained


def push_and_evaluate(run: RLRun, changed: set[str], step: int, metrics: dict[str, Any],
                      timer: StepTimer) -> None:
    """The step after its update: push the ``changed`` adapters, then evaluate if due (into ``metrics``)."""
    metrics.update(push_adapters(run, changed, step, timer))
    run.mark_served(changed, step)
    metrics.update(evaluate_if_due(run, step, timer))


def refuse_stale_rows(metrics: dict[str, Any]) -> None:
    """Every row must come from its agent's newest adapter: anything else is a bug in the sync."""
    if metrics.get("rollout/stale_rows", 0) > 0:
        raise RuntimeError(STALE_ERROR.format(rows=int(metrics["rollout/stale_rows"])))


def update(run: RLRun, batch: DataProto, request: UpdateRequest, timer: StepTimer) -> UpdateResult:
    """The train workers update the adapters agent after agent, each only from its own rows; the update's
    MFU joins its metrics."""
    with timer("update"):
        trained = run.workers.train.train_step(batch, request)
    mfu = update_mfu_metrics(run.cfg, batch, trained, timer.times, run.shape, run.gpus, run.peak_flops,
                             run.shares_prompts)
    return dataclasses.replace(trained, metrics={**trained.metrics, **mfu})


def push_adapters(run: RLRun, changed: set[str], step: int, timer: StepTimer) -> dict[str, float]:
    """Wake the engines (if they slept) and install the adapters that changed under version = step."""
    with timer("sync"):
        if run.engine_sleep is not None:
            with timer("sync_wake"):
                run.workers.rollout.wake_up()
        return run.sync.push(changed, step, timer)  # export, install, versions checked

