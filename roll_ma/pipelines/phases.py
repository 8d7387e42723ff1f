"""Supervised runs: a chain of phases (sft, dpo, eval) on one set of workers, each phase resumable.

What a run does (``run_phases``):

1. Start the workers once: env workers, rollout workers serving every agent's adapter, train workers
   (one DeepSpeed engine per trainable adapter; with a frozen copy of each when a DPO phase's
   reference is "the adapter as the phase started"). A teacher's workers start only for the phase
   that reads from it, and stop when it is done.
2. Run the phases in order (``PHASES``): ``eval`` plays the held-out problems greedily and reports the
   env's metrics (reflection: p1@t1, m1@tK, p1@tK); ``sft`` (``phase_sft.py``) and ``dpo``
   (``phase_dpo.py``) train every agent on its own rows, each with its own optimizer, fresh at the
   phase's start (as a new trainer would be). The rollout engines get the trained adapters before
   anything is generated again.
3. Checkpoints (every ``trainer.save_every`` steps and at the end) hold the adapters (and their frozen
   copies), optimizer states, the data cursor, the phase and its progress: ``trainer.resume=auto``
   continues a run where it stopped, inside a phase, from the same manifest-checked checkpoint the RL
   loop would take.

``metrics.jsonl``'s step counts optimizer steps over the whole run (agent/<name>/sft_loss,
agent/<name>/rewards/margins, ...), one line per step: what a phase measures after a step (an eval,
its timing) joins that step's line (step 0: before any training), the rows a phase builds join the
line of its first step.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from roll_ma.config.phase_plan import Phase, needs_reference_copies, needs_teacher, plan_phases
from roll_ma.config.schema import RunConfig
from roll_ma.pipelines.phase_context import PhaseContext, headline


def run_eval_phase(ctx: PhaseContext, phase: Phase, progress: dict[str, Any]) -> None:
    metrics = ctx.evaluate(phase.name)
    ctx.results[phase.name] = {**metrics, "step": float(ctx.step)}
    ctx.log({**metrics, "phase": phase.index})


def phase_runners() -> dict[str, Callable[[PhaseContext, Phase, dict[str, Any]], None]]:
    from roll_ma.pipelines.phase_dpo import run_dpo_phase
    from roll_ma.pipelines.phase_sft import run_sft_phase

    return {"eval": run_eval_phase, "sft": run_sft_phase, "dpo": run_dpo_phase}


def run_phases(cfg: RunConfig) -> dict[str, Any]:
    """Run ``cfg``'s phases (or its one ``train.objective`` phase); returns the eval results by phase."""
    from roll_ma import checkpoint as ckpt
    from roll_ma.config.seats import resolve_seats
    from roll_ma.distributed.ray_env import init_ray
    from roll_ma.envs.registry import resolve_env_class
    from roll_ma.error_report import run_log
    from roll_ma.pipelines.episodes import EpisodePlanner
    from roll_ma.pipelines.multi_agent_pipeline import (
        _check_cluster_gpus,
        _num_players,
        _set_aside_previous_run,
    )
    from roll_ma.pipelines.workers import build_workers, process_env
    from roll_ma.preflight.checkpoint_compat import run_signature
    from roll_ma.tracking import Tracker

    out_dir = Path(cfg.trainer.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # the newest checkpoint that matches its manifest, as the RL loop resumes; damaged newer ones set aside
    resume_from = ckpt.resume_checkpoint(out_dir) if cfg.trainer.resume == "auto" else None
    if cfg.trainer.resume == "never":
        _set_aside_previous_run(out_dir)
    ckpt.prune(out_dir, cfg.trainer.keep_last)
    phases = plan_phases(cfg)
    signature = run_signature(cfg)  # before random_weights rewrites model.path
    if cfg.model.random_weights:
        from roll_ma.models.random_weights import use_random_weights

        cfg = use_random_weights(cfg)  # benchmarks: model.path -> a random model of that architecture
    init_ray(cfg.resources.ray_address, env_vars=process_env(cfg), log_file=run_log(cfg.trainer.output_dir))
    _check_cluster_gpus(cfg)
    seats = resolve_seats(cfg, _num_players(cfg, resolve_env_class))
    planner = EpisodePlanner(cfg.env, cfg.seed)
    teacher_workers = cfg.teacher.rollout.num_workers if needs_teacher(phases) else 0
    workers = build_workers(cfg, seats, needs_reference_copies(phases), teacher_workers)
    print(
        f"[roll_ma] {cfg.name}: phases {[p.name for p in phases]}, agents {[a.name for a in cfg.agents]}, "
        f"rollout={cfg.rollout.backend}, output {out_dir}",
        flush=True,
    )
    try:
        workers.train.init_model(total_steps=None)
        workers.rollout.init_model()
        start, progress, step, results = 0, {}, 0, {}
        if resume_from is not None:
            step, path = resume_from
            workers.train.load_checkpoint(str(path / "trainer"))
            state = ckpt.load_state(path)
            planner.load_state_dict(state["planner"])
            start, progress, results = state["phase"], state["progress"], state["results"]
            print(f"[roll_ma] resumed from {path}: phase {start} of {len(phases)}, step {step}", flush=True)
        tracker = Tracker(
            out_dir,
            cfg.tracking,
            cfg.name,
            dataclasses.asdict(cfg),
            resume_step=step if resume_from is not None else None,
        )
        ctx = PhaseContext(cfg, workers, planner, tracker, seats, out_dir, step, results, signature,
                           saved_step=step)
        ctx.sync()  # the rollout serves what the trainer holds (the checkpoint's adapters on resume)
        runners = phase_runners()
        for phase in phases[start:]:
            began = time.perf_counter()
            runners[phase.objective](ctx, phase, progress if phase.index == start else {})
            seconds = time.perf_counter() - began
            ctx.flush_ahead()  # a phase that took no step: what it measured joins the current line
            ctx.log({f"timing/phase/{phase.name}": seconds, "phase": phase.index})
            print(f"[roll_ma] phase {phase.name} done in {seconds:.0f} s", flush=True)
            if ctx.save_due() or phase is phases[-1]:  # checkpoints: every save_every steps and the end
                ctx.save(phase.index + 1, {})
        tracker.close()
        print_summary(ctx, phases)
        return ctx.results
    finally:
        workers.shutdown()


def print_summary(ctx: PhaseContext, phases: list[Phase]) -> None:
    evals = [p.name for p in phases if p.objective == "eval" and p.name in ctx.results]
    k = ctx.cfg.env.max_rounds
    for name in evals:
        print(
            f"[roll_ma] {name:>12s} (step {int(ctx.results[name]['step'])}): "
            f"{headline(ctx.results[name], k)}",
            flush=True,
        )
    from roll_ma import checkpoint as ckpt
    from roll_ma.pipelines.multi_agent_pipeline import done_line

    last = ckpt.latest_checkpoint(ctx.out_dir)  # the end of the run always writes one
    print(done_line(last[1] if last else None, ctx.out_dir / "metrics.jsonl", None), flush=True)
