"""The dpo phase: every agent learns from its own (prompt, chosen, rejected) pairs against its reference.

At the phase's start each adapter gets a fresh optimizer and its reference is fixed: a frozen copy
of the adapter as it is now (``dpo.reference=phase_start``; ``iteration_start`` refreshes the copy
at every iteration of the loop), or the base with adapters off (``base``). The reference's
log-probs of a set of pairs are computed once, before its steps (TRL's ``precompute_ref_log_probs``).

Pairs (``dpo.source``):

- ``file``: TRL's prompt / chosen / rejected columns and a column naming the agent
  (``data/chat_files.py``); ``dpo.epochs`` passes of ``dpo.batch_size`` pairs per agent and step.
- ``built``: the iterative loop, ``dpo.iterations`` times: (1) play ``dpo.problems_per_iteration``
  training problems with the current adapters (sampled); (2) branch the states of those episodes
  ``dpo.branches`` times; (3) build the pairs (``reflection_data.build_pairs``: the actor's right vs
  wrong refinements of one context, the critic's feedback followed by a right vs a wrong
  refinement); (4) ``dpo.steps_per_iteration`` train steps; (5) sync the adapters into the
  rollout engines. A checkpoint closes an iteration in which a ``trainer.save_every`` step
  fell; a run resumed inside an iteration repeats it from its start (the same problems and, with
  the same adapters, the same samples).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from roll_ma.config.phase_plan import Phase
from roll_ma.pipelines.phases.context import PhaseContext, agent_schedule
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import DPOSettings, PairReference

SHOWN = ("dpo_loss", "rewards/margins", "rewards/accuracies")


def run_dpo_phase(ctx: PhaseContext, phase: Phase, progress: dict[str, Any]) -> None:
    if not progress.get("started"):
        ctx.workers.train.reset_optimizers(phase.lr)  # a new phase: a new optimizer, as a new trainer
        if phase.dpo.reference != "base":
            ctx.workers.train.snapshot_reference()
        progress = {"started": True, "iteration": 0, "steps_done": 0}  # the next checkpoint records it
    if phase.dpo.source == "file":
        pairs = file_pairs(ctx, phase)
        schedule = agent_schedule(
            _agents_of(pairs), phase.dpo.batch_size, phase.dpo.epochs, (ctx.cfg.seed, phase.name)
        )
        train_on_pairs(ctx, phase, pairs, schedule, int(progress.get("steps_done", 0)), checkpoints=True)
    else:
        for it in range(int(progress.get("iteration", 0)), phase.dpo.iterations):
            iteration(ctx, phase, it)
            if ctx.save_due() and it + 1 < phase.dpo.iterations:  # the last one: run_phases saves
                ctx.save(phase.index, {"started": True, "iteration": it + 1})
    ctx.sync()


def iteration(ctx: PhaseContext, phase: Phase, it: int) -> None:
    """One round of the loop: generate -> pairs -> DPO steps -> sync (module docstring)."""
    from roll_ma.metrics import episode_env_metrics
    from roll_ma.pipelines.phases.reflection_data import (
        branch_specs,
        branches_from_rollout,
        build_pairs,
        episode_texts,
    )
    from roll_ma.workers.env_worker import EpisodeSpec

    d = phase.dpo
    if d.reference == "iteration_start" and it > 0:
        ctx.workers.train.snapshot_reference()
    tag = f"{phase.name}-i{it}"
    problems = ctx.planner.train_data.next_batch(d.problems_per_iteration)
    played = [EpisodeSpec(f"{tag}-p{i}", f"{tag}-p{i}", i, p) for i, p in enumerate(problems)]
    batch, episodes = ctx.play(played)
    specs = branch_specs(played, episode_texts(batch), d.branches, d.states_per_episode, ctx.cfg.seed, tag)
    branched, branch_episodes = ctx.play(specs)
    wanted = {ctx.agent_ids[a] for a in phase.agents}
    pairs = [
        p
        for p in build_pairs(branches_from_rollout(branched, branch_episodes), d.pairs_per_state)
        if p.agent_id in wanted
    ]
    metrics: dict[str, float] = {
        **episode_env_metrics(episodes, "rollout/env"),
        "phase": phase.index,
        "dpo/iteration": float(it + 1),
        "dpo/states": float(len(specs) // d.branches),
    }
    for name in phase.agents:
        metrics[f"dpo/pairs/{name}"] = float(sum(p.agent_id == ctx.agent_ids[name] for p in pairs))
    if pairs:
        rows = pair_rows_of(pairs, batch.meta_info.get("pad_id", 0))
        schedule = agent_schedule(
            _agents_of(rows), d.batch_size, 1, (ctx.cfg.seed, tag), steps=d.steps_per_iteration
        )
        train_on_pairs(ctx, phase, rows, schedule, 0, checkpoints=False)
        ctx.sync()
    # the line of the iteration's last step (no pairs: of the step the run is at; dpo/iteration says which)
    ctx.log(metrics)
    shown = " ".join(f"{name} {int(metrics[f'dpo/pairs/{name}'])}" for name in phase.agents)
    print(
        f"[roll_ma] {phase.label} iteration {it + 1}/{d.iterations}: pairs {shown}; sampled "
        f"p1@t1={metrics.get('rollout/env/p1@t1', 0):.3f} p1@t{ctx.cfg.env.max_rounds}="
        f"{metrics.get(f'rollout/env/p1@t{ctx.cfg.env.max_rounds}', 0):.3f}",
        flush=True,
    )


def pair_rows_of(pairs: list, pad_id: int) -> DataProto:
    from roll_ma.data.rows import pair_rows

    return pair_rows(
        [p.prompt_ids for p in pairs],
        [p.chosen_ids for p in pairs],
        [p.rejected_ids for p in pairs],
        [p.agent_id for p in pairs],
        pad_id,
    )


def file_pairs(ctx: PhaseContext, phase: Phase) -> DataProto:
    from roll_ma.data.chat_files import prompt_ids, read_dpo_file, reply_ids
    from roll_ma.data.rows import pair_rows
    from roll_ma.models.loading import load_tokenizer

    tok = load_tokenizer(ctx.cfg.model)
    examples = [
        e
        for e in read_dpo_file(str(phase.dpo.path), list(ctx.agent_ids), phase.dpo.agent_key)
        if e.agent in phase.agents
    ]
    limit = ctx.cfg.model.max_prompt_tokens
    return pair_rows(
        [prompt_ids(tok, e.prompt, limit) for e in examples],
        [reply_ids(tok, e.replies[0]) for e in examples],
        [reply_ids(tok, e.replies[1]) for e in examples],
        [ctx.agent_ids[e.agent] for e in examples],
        tok.pad_token_id,
    )


def train_on_pairs(
    ctx: PhaseContext,
    phase: Phase,
    pairs: DataProto,
    schedule: list[np.ndarray],
    start: int,
    checkpoints: bool,
) -> dict[str, float]:
    """The reference's log-probs of ``pairs``, then the scheduled DPO steps; returns the mean over the steps
    of every agent metric (the last step's for the rest)."""
    d = phase.dpo
    reference: PairReference = "base" if d.reference == "base" else "copy"
    settings = DPOSettings(beta=d.beta, label_smoothing=d.label_smoothing, rpo_alpha=d.rpo_alpha)
    seen: list[dict[str, float]] = []
    with ctx.training():  # a colocated rollout engine sleeps through the reference pass and the steps
        pairs = pairs.union(ctx.workers.train.compute_pair_ref_log_probs(pairs, reference))
        for k in range(start, len(schedule)):
            metrics = ctx.train(pairs.select_idxs(schedule[k]), "dpo", dpo=settings)
            seen.append(metrics)
            ctx.log({**metrics, "phase": phase.index})
            if checkpoints:  # a file phase reports and checkpoints step by step
                if (k + 1) % ctx.cfg.trainer.log_every == 0 or k + 1 == len(schedule):
                    shown = summary(metrics, phase.agents)
                    print(f"[roll_ma] {phase.label} {k + 1}/{len(schedule)}: {shown}", flush=True)
                if ctx.save_due() and k + 1 < len(schedule):
                    ctx.save(phase.index, {"started": True, "steps_done": k + 1})
    if not seen:
        return {}
    out = dict(seen[-1])
    for key in {k for m in seen for k in m if k.startswith("agent/")}:
        values = [m[key] for m in seen if key in m]
        out[key] = float(np.mean(values))
    if not checkpoints:
        print(f"[roll_ma] {phase.label} step {ctx.step}: {summary(out, phase.agents)}", flush=True)
    return out


def summary(metrics: dict[str, float], agents: list[str]) -> str:
    parts = []
    for name in agents:
        shown = [
            f"{k.split('/')[-1]} {metrics[f'agent/{name}/{k}']:.3f}"
            for k in SHOWN
            if f"agent/{name}/{k}" in metrics
        ]
        if shown:
            parts.append(f"{name}: " + ", ".join(shown))
    return "; ".join(parts)


def _agents_of(rows: DataProto) -> np.ndarray:
    return np.asarray([int(a) for a in rows.non_tensor["agent_id"]]) if len(rows) else np.zeros(0, dtype=int)
