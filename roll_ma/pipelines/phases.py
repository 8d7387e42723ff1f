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
3. Checkpoints hold the adapters (and their frozen copies), optimizer states, the data cursor, the
   phase and its progress: ``trainer.resume=auto`` continues a run where it stopped, inside a phase.

``metrics.jsonl``'s step counts optimizer steps over the whole run (agent/<name>/sft_loss,
agent/<name>/rewards/margins, ...); eval lines carry the step they ran at.
"""

from __future__ import annotations

import dataclasses
import time
import zlib
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from roll_ma.config.schema import DPOConfig, PhaseConfig, RunConfig, SFTConfig
from roll_ma.protocol import DataProto


@dataclass
class Phase:
    """One phase as it runs: position, name, objective, the agents it trains, its sft / dpo settings."""

    index: int
    name: str
    objective: str
    agents: list[str]
    sft: SFTConfig
    dpo: DPOConfig
    lr: float | None = None


def plan_phases(cfg: RunConfig) -> list[Phase]:
    """``cfg.phases``, or the one phase of ``train.objective``; overrides applied (validated before)."""
    listed = cfg.phases or [PhaseConfig(objective=cfg.train.objective)]
    trainable = [a.name for a in cfg.agents if not a.frozen]
    return [
        Phase(
            i,
            p.name or f"{i}_{p.objective}",
            p.objective,
            list(p.agents or trainable),
            dataclasses.replace(cfg.sft, **p.sft),
            dataclasses.replace(cfg.dpo, **p.dpo),
            p.lr,
        )
        for i, p in enumerate(listed)
    ]


def needs_reference_copies(phases: list[Phase]) -> bool:
    return any(p.objective == "dpo" and p.dpo.reference != "base" for p in phases)


def needs_teacher(phases: list[Phase]) -> bool:
    return any(p.objective == "sft" and p.sft.source == "teacher" for p in phases)


@dataclass
class PhaseContext:
    """What every phase works with: the config, the workers, the data cursor, the step, checkpoints."""

    cfg: RunConfig
    workers: Any
    planner: Any
    tracker: Any
    seats: list[str]
    out_dir: Path
    step: int = 0
    results: dict[str, dict[str, float]] = field(default_factory=dict)  # eval metrics by phase name
    signature: dict[str, Any] | None = None  # what each checkpoint records of the config (resume compares it)

    @property
    def agent_ids(self) -> dict[str, int]:
        return {a.name: i for i, a in enumerate(self.cfg.agents)}

    def phase_dir(self, phase: Phase) -> Path:
        path = self.out_dir / "phases" / phase.name
        path.mkdir(parents=True, exist_ok=True)
        return path

    # ------------------------------------------------------------------ episodes
    def play(
        self, specs: list, greedy: bool = False, rollout: Any = None, env: Any = None
    ) -> tuple[DataProto, list[dict]]:
        """Play ``specs`` on the env workers against ``rollout`` (default: the run's, current adapters)."""
        from roll_ma.packing import concat_padded

        env = env or self.workers.env
        n = env.world_size
        parts = env.run_episodes(
            rollout or self.workers.rollout, [specs[w::n] for w in range(n)], self.step, greedy
        )
        batch = concat_padded(parts)
        episodes = [e for p in parts for e in p.meta_info["episodes"]]
        batch.pop(meta_info_keys=["episodes"])
        return batch, episodes

    # ------------------------------------------------------------------ training
    @contextmanager
    def training(self):
        """Colocated on a GPU: the rollout engines sleep while the train workers update."""
        if self.workers.colocated():
            self.workers.rollout.sleep()
        try:
            yield
        finally:
            if self.workers.colocated():
                self.workers.rollout.wake_up()

    def train(self, rows: DataProto, objective: str, **meta: Any) -> dict[str, float]:
        """One train step of ``objective`` on ``rows`` (each agent: one optimizer step on its rows)."""
        rows.meta_info.update(objective=objective, step=self.step + 1, temperature=1.0, **meta)
        metrics = self.workers.train.train_step(rows)[0]
        self.step += 1
        return metrics

    def sync(self) -> None:
        """Serve the trained adapters in the rollout engines (version = the step that produced them)."""
        trainable = sorted({a.adapter_name for a in self.cfg.agents if not a.frozen})
        if trainable:
            tensors = self.workers.train.export_adapters(trainable, self._sync_dtype())[0]
            self.workers.rollout.update_adapters(tensors, self.step)

    def _sync_dtype(self) -> str | None:
        from roll_ma.strategies.rollout_common import adapter_sync_dtype

        return adapter_sync_dtype(self.cfg.rollout, self.cfg.model)

    # ------------------------------------------------------------------ bookkeeping
    def log(self, metrics: dict[str, Any]) -> None:
        self.tracker.log(metrics, self.step)

    def save(self, phase: int, progress: dict[str, Any]) -> None:
        """An atomic checkpoint: trainer state, data cursor, the phase to run and its progress."""
        from roll_ma import checkpoint as ckpt

        tmp = ckpt.begin_checkpoint(self.out_dir, self.step)
        self.workers.train.save_checkpoint(str(tmp / "trainer"))
        state = {
            "phase": phase,
            "progress": progress,
            "planner": self.planner.state_dict(),
            "results": self.results,
            "config": self.cfg.name,
        }
        ckpt.finish_checkpoint(tmp, self.step, state, self.cfg.trainer.keep_last, self.signature)

    def evaluate(self, label: str) -> dict[str, float]:
        from roll_ma.pipelines.evaluation import evaluate

        metrics = evaluate(self.workers, self.planner, self.seats, self.cfg.env.eval_opponent, self.step)
        print(
            f"[roll_ma] eval {label} (step {self.step}): {headline(metrics, self.cfg.env.max_rounds)}",
            flush=True,
        )
        return metrics


def headline(metrics: dict[str, float], k: int, prefix: str = "eval/") -> str:
    """p1@t1, m1@tK, p1@tK (and the last answer's accuracy) of a metrics dict, as one line."""
    keys = ["p1@t1", f"m1@t{k}", f"p1@t{k}", f"acc@t{k}"]
    shown = [f"{key}={metrics[prefix + key]:.3f}" for key in keys if prefix + key in metrics]
    return " ".join(shown) if shown else ", ".join(f"{k}={v:.3f}" for k, v in sorted(metrics.items())[:6])


def run_eval_phase(ctx: PhaseContext, phase: Phase, progress: dict[str, Any]) -> None:
    metrics = ctx.evaluate(phase.name)
    ctx.results[phase.name] = {**metrics, "step": float(ctx.step)}
    ctx.log({**metrics, "phase": phase.index})


def agent_schedule(
    agent_ids: np.ndarray, batch_size: int, epochs: int, seed: Any, steps: int | None = None
) -> list[np.ndarray]:
    """Row positions of each train step: every agent's rows shuffled per epoch and cut in ``batch_size``
    pieces, the agents' i-th pieces together in step i (an agent with fewer rows is done earlier).
    ``steps``: exactly that many steps, every agent cycling through its rows (epochs ignored)."""
    per_agent = {}
    for a in sorted(set(agent_ids.tolist())):
        rows = np.nonzero(agent_ids == a)[0]
        rng = np.random.default_rng([zlib.crc32(str(seed).encode()), int(a)])
        need = epochs if steps is None else -(-steps * batch_size // len(rows))
        order = np.concatenate([rows[rng.permutation(len(rows))] for _ in range(max(need, 1))])
        if steps is None:  # whole epochs, each cut on its own
            chunks = [
                c
                for e in range(epochs)
                for c in np.array_split(
                    order[e * len(rows) : (e + 1) * len(rows)], -(-len(rows) // batch_size)
                )
            ]
        else:
            chunks = [order[i * batch_size : (i + 1) * batch_size] for i in range(steps)]
        per_agent[a] = chunks
    total = max((len(c) for c in per_agent.values()), default=0)
    return [np.sort(np.concatenate([c[i] for c in per_agent.values() if i < len(c)])) for i in range(total)]


def phase_runners() -> dict[str, Callable[[PhaseContext, Phase, dict[str, Any]], None]]:
    from roll_ma.pipelines.phase_dpo import run_dpo_phase
    from roll_ma.pipelines.phase_sft import run_sft_phase

    return {"eval": run_eval_phase, "sft": run_sft_phase, "dpo": run_dpo_phase}


def run_phases(cfg: RunConfig) -> dict[str, Any]:
    """Run ``cfg``'s phases (or its one ``train.objective`` phase); returns the eval results by phase."""
    from roll_ma import checkpoint as ckpt
    from roll_ma.config.validate import resolve_seats
    from roll_ma.distributed.ray_env import init_ray
    from roll_ma.envs.registry import resolve_env_class
    from roll_ma.pipelines.episodes import EpisodePlanner
    from roll_ma.pipelines.multi_agent_pipeline import (
        _check_cluster_gpus,
        _num_players,
        _set_aside_previous_run,
    )
    from roll_ma.pipelines.workers import build_workers
    from roll_ma.preflight.checkpoint_compat import run_signature
    from roll_ma.tracking import Tracker

    out_dir = Path(cfg.trainer.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    resume_from = ckpt.latest_checkpoint(out_dir) if cfg.trainer.resume == "auto" else None
    if cfg.trainer.resume == "never":
        _set_aside_previous_run(out_dir)
    ckpt.prune(out_dir, cfg.trainer.keep_last)
    phases = plan_phases(cfg)
    signature = run_signature(cfg)  # before random_weights rewrites model.path
    if cfg.model.random_weights:
        from roll_ma.models.random_weights import use_random_weights

        cfg = use_random_weights(cfg)  # benchmarks: model.path -> a random model of that architecture
    init_ray(cfg.resources.ray_address)
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
        ctx = PhaseContext(cfg, workers, planner, tracker, seats, out_dir, step, results, signature)
        ctx.sync()  # the rollout serves what the trainer holds (the checkpoint's adapters on resume)
        runners = phase_runners()
        for phase in phases[start:]:
            began = time.perf_counter()
            runners[phase.objective](ctx, phase, progress if phase.index == start else {})
            seconds = time.perf_counter() - began
            ctx.log({f"timing/phase/{phase.name}": seconds, "phase": phase.index})
            print(f"[roll_ma] phase {phase.name} done in {seconds:.0f} s", flush=True)
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
    print(f"[roll_ma] done: metrics {ctx.out_dir / 'metrics.jsonl'}", flush=True)
