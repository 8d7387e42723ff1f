"""Supervised runs: a chain of phases (sft, dpo, eval) on one set of workers, each phase resumable.

What a run does (``run_phases``):

1. Start the workers once: env workers, rollout workers serving every agent's adapter, train workers
   (one DeepSpeed engine per trainable adapter; with a frozen copy of each when a DPO phase's
   reference is "the adapter as the phase started"). A teacher's workers start only for the phase
   that reads from it, and stop when it is done.
2. Run the phases in order (``PHASES``): ``eval`` plays the held-out problems greedily and reports the
   env's metrics (reflection: p1@t1, m1@tK, p1@tK); ``sft`` (``sft.py``) and ``dpo``
   (``dpo.py``) train every agent on its own rows, each with its own optimizer, fresh at the
   phase's start (as a new trainer would be). The rollout engines get the trained adapters before
   anything is generated again.
3. Checkpoints (every ``trainer.save_every`` steps and at the end) hold the adapters (and their frozen
   copies), optimizer states, the data cursor, the phase and its progress: ``trainer.resume=auto``
   continues a run where it stopped, inside a phase, from the same manifest-checked checkpoint the RL
   loop would take (``pipelines/session.py``: one setup, resume and teardown for both kinds of run).

``metrics.jsonl``'s step counts optimizer steps over the whole run (agent/<name>/sft_loss,
agent/<name>/rewards/margins, ...), one line per step: what a phase measures after a step (an eval,
its timing) joins that step's line (step 0: before any training), the rows a phase builds join the
line of its first step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from roll_ma import checkpoint as ckpt
from roll_ma.config.phase_plan import Phase, needs_reference_copies, needs_teacher, plan_phases
from roll_ma.config.run_plan import RunPlan
from roll_ma.config.schema import RunConfig
from roll_ma.pipelines.phases.context import PhaseContext, headline
from roll_ma.pipelines.phases.dpo import run_dpo_phase
from roll_ma.pipelines.phases.sft import run_sft_phase
from roll_ma.pipelines.session import done_line, open_session, start_session
from roll_ma.pipelines.step_timer import startup_line
from roll_ma.tracking import plot_rewards


def run_eval_phase(ctx: PhaseContext, phase: Phase, progress: dict[str, Any]) -> None:
    metrics = ctx.evaluate(phase.name)
    ctx.results[phase.name] = {**metrics, "step": float(ctx.step)}
    ctx.log({**metrics, "phase": phase.index})


def phase_runners() -> dict[str, Callable[[PhaseContext, Phase, dict[str, Any]], None]]:
    return {"eval": run_eval_phase, "sft": run_sft_phase, "dpo": run_dpo_phase}


def run_phases(cfg: RunConfig, plan: RunPlan) -> dict[str, Any]:
    """Run ``cfg``'s phases (or its one ``train.objective`` phase; ``plan``: its run plan); returns the eval
    results by phase."""
    phases = plan_phases(cfg)
    teacher_workers = cfg.teacher.rollout.num_workers if needs_teacher(phases) else 0
    with open_session(cfg, plan, needs_reference_copies(phases), teacher_workers) as session:
        cfg = session.cfg
        agents = [a.name for a in cfg.agents]
        print(f"[roll_ma] {cfg.name}: phases {[p.name for p in phases]}, agents {agents}, "
              f"rollout={cfg.rollout.backend}, output {session.out_dir}", flush=True)
        # DPO's reference is on the train workers (adapters off, or a frozen copy): no reference model
        state = start_session(session, train_steps=None, initial_adapters=True, reference_model=False)
        start, progress, results = 0, {}, {}
        if state is not None:
            start, progress, results = state["phase"], state["progress"], state["results"]
            session.say(f"[roll_ma] resumed from {session.saved}: phase {start} of {len(phases)}, "
                        f"step {session.start_step}")
        step = session.start_step
        ctx = PhaseContext(cfg, session.plan, session.workers, session.planner, session.tracker,
                           session.seats, session.out_dir, step, results, session.signature, saved_step=step)
        with session.startup("first_sync"):
            ctx.sync()  # the rollout serves what the trainer holds (the checkpoint's adapters on resume)
        print(startup_line(session.startup.total()), flush=True)
        ctx.log_ahead(dict(session.startup.times))  # the start-up joins the next line, as in the RL loop
        run_each_phase(ctx, phases, start, progress)
        session.tracker.close()
        print_summary(ctx, phases)
        return ctx.results


def run_each_phase(ctx: PhaseContext, phases: list[Phase], start: int, progress: dict[str, Any]) -> None:
    """The phases from ``start`` on (``progress``: how far the first of them got before a resume)."""
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


def print_summary(ctx: PhaseContext, phases: list[Phase]) -> None:
    evals = [p.name for p in phases if p.objective == "eval" and p.name in ctx.results]
    k = ctx.cfg.env.max_rounds
    for name in evals:
        print(
            f"[roll_ma] {name:>12s} (step {int(ctx.results[name]['step'])}): "
            f"{headline(ctx.results[name], k)}",
            flush=True,
        )
    last = ckpt.latest_checkpoint(ctx.out_dir)  # the end of the run always writes one
    metrics_path = ctx.out_dir / "metrics.jsonl"
    plot = plot_rewards(metrics_path, ctx.out_dir / "rewards.png", [a.name for a in ctx.cfg.agents])
    print(done_line(last[1] if last else None, metrics_path, plot), flush=True)
