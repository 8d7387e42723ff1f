"""The sft phase: build every agent's SFT rows once, then optimizer steps over them.

Where the rows come from (``sft.source``):

- ``rejection``: the run's own episodes with the current adapters (``sft.samples_per_problem`` per
  problem, sampled), keeping the accepted turns (``reflection_data.accepted_rows``: an
  answer that is right, a critique after which the refinement is right), or every turn (accept: all).
- ``teacher``: the actor answers ``sft.problems`` problems; the teacher (``teacher.model``, its own
  rollout workers, no adapters) writes a critique of each first answer and a refinement after it
  (``sft.samples_per_problem`` times); the teacher's turns are replayed in this run's tokens
  (``workers/replay.py``), and the accepted ones become the critic's and the actor's rows.
- ``file``: a user's jsonl / parquet in chat-messages form with a column naming the agent
  (``data/chat_files.py``).

The rows are saved under ``<output_dir>/phases/<phase>/`` before the first step, so a resumed phase
trains on the very same rows. Each train step gives every agent one optimizer step on up to
``sft.batch_size`` of its own rows (``context.agent_schedule``), for ``sft.epochs`` passes.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from roll_ma.config.phase_plan import Phase
from roll_ma.pipelines.phases.context import PhaseContext, agent_schedule
from roll_ma.protocol import DataProto
from roll_ma.training.objective_sft import SFT_KEYS


def run_sft_phase(ctx: PhaseContext, phase: Phase, progress: dict[str, Any]) -> None:
    path = ctx.phase_dir(phase) / "sft_rows.pkl"
    if progress.get("data_ready"):
        rows = DataProto.load_from_disk(path)
    else:
        rows, metrics = SOURCES[phase.sft.source](ctx, phase)
        rows = _rows_of(rows, [ctx.agent_ids[a] for a in phase.agents])
        tmp = path.with_suffix(".tmp")
        rows.save_to_disk(tmp)
        os.replace(tmp, path)
        ctx.workers.train.reset_optimizers(phase.lr)  # a new phase: a new optimizer, as a new trainer
        counts = {
            f"sft/{name}/rows": float((rows.non_tensor["agent_id"] == i).sum()) if len(rows) else 0.0
            for name, i in ctx.agent_ids.items()
            if name in phase.agents
        }
        ctx.log_ahead({**metrics, **counts, "phase": phase.index})
        per_agent = ", ".join(f"{key.split('/')[1]} {int(v)}" for key, v in counts.items())
        print(
            f"[roll_ma] {phase.label}: {len(rows)} rows from {phase.sft.source} ({per_agent})", flush=True
        )
        progress = {"data_ready": True, "steps_done": 0}  # the next checkpoint records it
    if len(rows) == 0:
        print(f"[roll_ma] {phase.label}: no rows to train on; the phase does nothing", flush=True)
        return
    agent_of_row = np.asarray([int(a) for a in rows.non_tensor["agent_id"]])
    schedule = agent_schedule(
        agent_of_row, phase.sft.batch_size, phase.sft.epochs, (ctx.cfg.seed, phase.name)
    )
    if phase.sft.max_steps:
        schedule = schedule[: phase.sft.max_steps]
    names = list(phase.agents)
    with ctx.training():  # one sleep of a colocated rollout engine for the whole phase
        for k in range(int(progress.get("steps_done", 0)), len(schedule)):
            metrics = ctx.train(rows.select_idxs(schedule[k]), "sft")
            ctx.log({**metrics, "phase": phase.index})
            if (k + 1) % ctx.cfg.trainer.log_every == 0 or k + 1 == len(schedule):
                losses = " ".join(f"{n} {metrics[f'agent/{n}/sft_loss']:.3f}" for n in names
                                  if f"agent/{n}/sft_loss" in metrics)
                print(f"[roll_ma] {phase.label} {k + 1}/{len(schedule)}: sft_loss {losses}", flush=True)
            if ctx.save_due() and k + 1 < len(schedule):  # the phase's last step: run_phases saves
                ctx.save(phase.index, {"data_ready": True, "steps_done": k + 1})
    ctx.sync()


def _rows_of(rows: DataProto, agent_ids: list[int]) -> DataProto:
    """The training columns of the rows of ``agent_ids``."""
    if len(rows) == 0:
        return rows
    keep = np.nonzero(np.isin([int(a) for a in rows.non_tensor["agent_id"]], agent_ids))[0]
    return rows.select_idxs(keep).select(batch_keys=list(SFT_KEYS), non_tensor_keys=["agent_id"])


def _problem_specs(ctx: PhaseContext, phase: Phase, n: int, copies: int, **extra: Any) -> list:
    """``copies`` episodes of each of ``n`` training problems (the data cursor advances)."""
    from roll_ma.workers.env_worker import EpisodeSpec

    problems = ctx.planner.train_data.next_batch(n)
    return [
        EpisodeSpec(f"{phase.name}-p{i}-e{k}", f"{phase.name}-p{i}", i, {**p, **extra})
        for i, p in enumerate(problems)
        for k in range(copies)
    ]


def _accepted(batch: DataProto, accept: str) -> DataProto:
    from roll_ma.pipelines.phases.reflection_data import accepted_rows

    return batch.select_idxs(accepted_rows(batch) if accept == "correct" else np.arange(len(batch)))


def rejection_rows(ctx: PhaseContext, phase: Phase) -> tuple[DataProto, dict[str, float]]:
    from roll_ma.metrics import episode_env_metrics

    specs = _problem_specs(ctx, phase, phase.sft.problems, phase.sft.samples_per_problem)
    batch, episodes = ctx.play(specs)
    return _accepted(batch, phase.sft.accept), episode_env_metrics(episodes, f"sft/{phase.name}/rollout")


def teacher_rows(ctx: PhaseContext, phase: Phase) -> tuple[DataProto, dict[str, float]]:
    from roll_ma.metrics import episode_env_metrics
    from roll_ma.pipelines.clusters import build_teacher
    from roll_ma.pipelines.phases.reflection_data import episode_texts
    from roll_ma.workers.env_worker import EpisodeSpec
    from roll_ma.workers.replay import ScriptedRollout, scripted_texts

    firsts = _problem_specs(ctx, phase, phase.sft.problems, 1, horizon=1)
    batch, _ = ctx.play(firsts)  # the actor's first answers, with its current adapter
    texts = episode_texts(batch)
    specs = [
        EpisodeSpec(
            f"{s.episode_id}-t{k}",
            s.group_id,
            s.seed,
            {**s.problem, "history": texts[s.episode_id][:1], "horizon": 2},
        )
        for s in firsts
        for k in range(phase.sft.samples_per_problem)
    ]
    shared_gpu = ctx.workers.resources.colocated("teacher", "rollout")
    if shared_gpu:  # the teacher needs room for a whole model: the weights go too, whatever sleep_level says
        ctx.workers.rollout.sleep(1)
    teacher = build_teacher(ctx.cfg, ctx.seats, ctx.workers.resources)
    try:
        taught, episodes = ctx.play(specs, rollout=teacher.rollout, env=teacher.env)
    finally:
        teacher.shutdown()
        if shared_gpu:
            ctx.workers.rollout.wake_up()
    # the teacher's turns, rendered and tokenized as this run's agents see them
    replayed, _ = ctx.play(specs, rollout=ScriptedRollout(ctx.cfg.model, scripted_texts(taught)))
    metrics = episode_env_metrics(episodes, f"sft/{phase.name}/teacher")
    return _accepted(replayed, phase.sft.accept), metrics


def file_rows(ctx: PhaseContext, phase: Phase) -> tuple[DataProto, dict[str, float]]:
    from roll_ma.data.chat_files import prompt_ids, read_sft_file, reply_ids
    from roll_ma.data.rows import sft_rows
    from roll_ma.models.loading import load_tokenizer

    tok = load_tokenizer(ctx.cfg.model)
    examples = read_sft_file(
        str(phase.sft.path), list(ctx.agent_ids), phase.sft.messages_key, phase.sft.agent_key
    )
    limit = ctx.cfg.model.max_prompt_tokens
    rows = sft_rows(
        [prompt_ids(tok, e.prompt, limit) for e in examples],
        [reply_ids(tok, e.replies[0]) for e in examples],
        [ctx.agent_ids[e.agent] for e in examples],
        tok.pad_token_id,
    )
    return rows, {}


SOURCES = {"rejection": rejection_rows, "teacher": teacher_rows, "file": file_rows}
