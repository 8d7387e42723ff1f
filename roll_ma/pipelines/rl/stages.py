"""The named stages of an RL step that the synchronous (``step.py``) and the streamed
(``step_streamed.py``) steps share: roll out, score, advantages, evaluate, record, checkpoint.

Each stage takes the run (``RLRun``), the step's batch where it needs it and the step's timer, and returns
what it made (a new batch, metrics); the step functions merge the metrics in the order the stages ran.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from roll_ma import checkpoint as ckpt
from roll_ma.algorithms.advantages import add_advantages
from roll_ma.algorithms.gae import critic_metrics, last_turns_only, team_reward_metrics
from roll_ma.metrics import (
    episode_env_metrics,
    forward_flops_of,
    logprob_gap_metrics,
    mfu_metrics,
    rollout_metrics,
    system_metrics,
)
from roll_ma.packing import concat_padded
from roll_ma.pipelines.evaluation import evaluate
from roll_ma.pipelines.rl.on_policy import old_log_probs_pass_reason
from roll_ma.pipelines.rl.rl_run import RLRun
from roll_ma.pipelines.step_timer import STAGES, StepTimer
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import ScoreRequest, UpdateRequest
from roll_ma.tracking import console_summary

NO_ROWS_ERROR = (
    "step {step} produced no training rows: every episode failed or made no model call{errors}; "
    "fix the workflow (or env), the run cannot update on nothing"
)


def roll_out(run: RLRun, step: int, timer: StepTimer) -> tuple[DataProto, dict[str, Any]]:
    """The step's rows (env workers x rollout workers; with max_staleness >= 1 mostly played already) and
    the rollout's metrics: rewards, turns, versions per agent, the envs' own metrics, its timeline."""
    with timer("rollout"):
        parts = run.rollouts.take(step)
        batch = concat_padded(parts)
        episodes = [e for p in parts for e in p.meta_info["episodes"]]
        # concat gathers every env worker's summaries; the workers below need none of them
        batch.pop(meta_info_keys=["episodes"])
    if len(batch) == 0:
        raise RuntimeError(NO_ROWS_ERROR.format(step=step, errors=_episode_errors(episodes)))
    metrics = rollout_metrics(batch, episodes, run.agent_names, run.expected_versions())
    metrics.update(episode_env_metrics(episodes, "rollout/env"))
    metrics.update(rollout_timeline(parts))
    return batch, metrics


def free_engine_memory(run: RLRun, timer: StepTimer) -> dict[str, float]:
    """Colocated on a GPU: the GPU's use with the engine awake; then (``rollout.sleep_level`` 1 or
    kv_cache) the engine sleeps, freeing its memory (or its KV cache's) for the trainer."""
    metrics = {}
    if run.workers.colocated() and run.cfg.resources.num_gpus > 0:
        metrics["system/gpu_used_gb_rollout"] = run.workers.train.gpu_memory_used_gb()
    if run.engine_sleep is not None:
        with timer("sleep"):
            run.workers.rollout.sleep(run.engine_sleep)
    return metrics


def score(run: RLRun, batch: DataProto, step: int, timer: StepTimer
          ) -> tuple[DataProto, dict[str, float], dict[str, float]]:
    """Reference and old log-probs (one row = one agent's turn, scored with its adapter) and, with GAE,
    the critic's values; returns the scored batch, its metrics and each scoring pass's FLOPs."""
    cfg = run.cfg
    request = ScoreRequest(temperature=cfg.rollout.temperature)
    # a scoring pass: one forward over every row (a group's prompt once where the passes share it)
    scored_flops = forward_flops_of(batch, run.shape, shared_prompts=run.shares_prompts)
    flops = {"reference": scored_flops, "values": forward_flops_of(batch, run.shape)}
    metrics: dict[str, float] = {}
    if run.plan.reference_needed:
        with timer("reference"):
            batch = batch.union(run.workers.ref_source.compute_ref_log_probs(batch, request))
    # without a reason for a pass of its own, the update's own forward gives pi_old
    if old_log_probs_pass_reason(cfg, run.plan, len(batch)) is not None:
        with timer("old_log_probs"):
            batch = batch.union(run.workers.train.compute_log_probs(batch, request))
        flops["old_log_probs"] = scored_flops
        if cfg.rollout.log_probs:
            metrics.update(logprob_gap_metrics(batch, run.agent_names))
    elif cfg.rollout.log_probs:
        metrics.update(_score_idle_agents(run, batch, step, timer, flops))
    if run.plan.uses_critic:  # the critic's values V(prefix) at every response token
        with timer("values"):
            batch = batch.union(run.workers.train.compute_values(batch))
    return batch, metrics, flops


def _score_idle_agents(run: RLRun, batch: DataProto, step: int, timer: StepTimer,
                       flops: dict[str, float]) -> dict[str, float]:
    """The update reports the trainer-vs-rollout gap of the agents it trains; the rows of the agents it
    leaves alone this step (frozen, not due, or waiting out the critic's warm-up: ``RunPlan.idle_agents``)
    are scored for theirs."""
    agent_ids = batch.non_tensor["agent_id"].astype(int)
    idle = np.nonzero(np.isin(agent_ids, run.plan.idle_agents(step)))[0]
    if not len(idle):
        return {}
    with timer("old_log_probs"):
        rows = batch.select_idxs(idle)
        request = ScoreRequest(temperature=run.cfg.rollout.temperature)
        rows = rows.union(run.workers.train.compute_log_probs(rows, request))
    flops["old_log_probs"] = forward_flops_of(rows, run.shape, shared_prompts=run.shares_prompts)
    return logprob_gap_metrics(rows, run.agent_names)


def compute_advantages(run: RLRun, batch: DataProto, step: int, timer: StepTimer
                       ) -> tuple[DataProto, dict[str, float]]:
    """Advantages normalised per agent, the team's reward metrics (and the critic's, with GAE)."""
    cfg = run.cfg
    with timer("advantages"):
        batch = add_advantages(batch, cfg.algorithm, run.advantage_weights)
    metrics = team_reward_metrics(batch, run.agent_names, cfg.algorithm.share_reward_in_agent)
    if run.plan.uses_critic:
        metrics.update(critic_metrics(batch, run.agent_names))
    if not cfg.train.use_all_traj:  # the last round's turns only (after GAE saw them all)
        batch = last_turns_only(batch)
    return batch, metrics


def update_request(run: RLRun, step: int, behavior_correction: bool) -> UpdateRequest:
    """What the step's update asks of the train workers: a ppo update at ``step`` of the agents the run
    plan says are due (``RunPlan.due_agents``); during ``critic.warmup_steps`` (GAE) only the critic trains
    (the agents' adapters are not pushed); ``behavior_correction``: rows of older adapters train with the
    decoupled objective (the streamed step)."""
    cfg = run.cfg
    return UpdateRequest(step=step, temperature=cfg.rollout.temperature, agents=run.plan.due_agents(step),
                         critic_only=run.plan.critic_only(step), behavior_correction=behavior_correction)


def evaluate_if_due(run: RLRun, step: int, timer: StepTimer) -> dict[str, float]:
    """Every ``trainer.eval_every`` steps and at the last: the held-out episodes, played greedily."""
    every, last = run.cfg.trainer.eval_every, run.cfg.trainer.max_steps
    if every <= 0 or not (step % every == 0 or step == last):
        return {}
    with timer("eval"):
        run.rollouts.settle()  # the env workers finish the next step's rollout first
        return evaluate(run.workers, run.session.planner, run.session.seats, run.cfg.env.eval_opponent, step)


def record(run: RLRun, step: int, metrics: dict[str, Any], timer: StepTimer, flops: dict[str, float],
           rollout_s: float) -> dict[str, Any]:
    """The step's timings, MFU, throughput and system metrics into ``metrics``; logged, and printed every
    ``trainer.log_every`` steps. ``rollout_s``: the rollout's own seconds (tokens per second)."""
    record_start = time.perf_counter()
    metrics.update(timer.times)
    metrics.update(timer.timeline)
    seconds = {p: timer.times.get(f"timing/{p}", 0.0) for p in run.gpus}
    metrics.update(mfu_metrics(flops, seconds, run.gpus, run.peak_flops))
    metrics.update(system_metrics())
    if run.cfg.model.random_weights:
        metrics["system/random_weights"] = 1.0
    if run.step_hook is not None:
        metrics.update(run.step_hook(run.workers, step) or {})
    tokens = metrics.get("rollout/response_tokens", 0.0)
    metrics["system/rollout_tokens_per_s"] = tokens / max(rollout_s, 1e-9)
    trained = sum(v for k, v in metrics.items() if k.startswith("agent/") and k.endswith("/tokens"))
    metrics["system/train_tokens_per_s"] = trained / max(metrics["timing/update"], 1e-9)
    now = time.perf_counter()
    metrics["timing/record"] = now - record_start  # metrics, per-rank gathers, MFU, the GPU query
    metrics["timing/step_wall"] = now - timer.started
    metrics["timing/unaccounted"] = metrics["timing/step_wall"] - sum(
        metrics.get(f"timing/{name}", 0.0) for name in STAGES
    )
    session = run.session
    if step == session.start_step + 1:
        metrics.update(session.startup.times)  # the run's start-up joins its first step's line
    session.tracker.log(metrics, step)
    if step % run.cfg.trainer.log_every == 0:
        print(console_summary(step, run.cfg.trainer.max_steps, metrics, run.agent_names), flush=True)
    return metrics


def save_checkpoint_if_due(run: RLRun, step: int) -> None:
    """Every ``trainer.save_every`` steps and at the last: trainer state and the episode planner's."""
    cfg, session = run.cfg, run.session
    if not ((cfg.trainer.save_every and step % cfg.trainer.save_every == 0) or step == cfg.trainer.max_steps):
        return
    tmp = ckpt.begin_checkpoint(session.out_dir, step)
    run.workers.train.save_checkpoint(str(tmp / "trainer"))
    # the planner as before any rollout not yet trained on: a resume plays those episodes again
    session.saved = ckpt.finish_checkpoint(
        tmp, step, {"planner": run.rollouts.planner_state(), "config": cfg.name},
        cfg.trainer.keep_last, session.signature, session.say,
    )


def rollout_timeline(parts: list[Any]) -> dict[str, float]:
    """Wall-clock start and end of a step's rollout, as its env workers saw them (benchmarks' timeline)."""
    starts = [p.meta_info["started_at"] for p in parts if "started_at" in p.meta_info]
    ends = [p.meta_info["finished_at"] for p in parts if "finished_at" in p.meta_info]
    if not (starts and ends):
        return {}
    return {"timeline/rollout_start": min(starts), "timeline/rollout_end": max(ends)}


def _episode_errors(episodes: list[dict]) -> str:
    errors = [e["error"] for e in episodes if e.get("error")]
    return f" (first error: {errors[0]})" if errors else ""
