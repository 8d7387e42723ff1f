"""What every supervised phase works with (``chain.py`` runs them; ``sft.py`` and ``dpo.py``
are two of them): the ``PhaseContext`` of workers, data cursor, step and checkpoints, and how an agent's
rows are cut into train steps (the phase plan itself is ``config.phase_plan``)."""

from __future__ import annotations

import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from roll_ma import checkpoint as ckpt
from roll_ma.config.phase_plan import Phase
from roll_ma.config.run_plan import RunPlan
from roll_ma.config.schema import RunConfig
from roll_ma.error_report import run_line
from roll_ma.inference.rollout_common import adapter_sync_dtype
from roll_ma.packing import concat_padded
from roll_ma.pipelines.clusters import RunWorkers
from roll_ma.pipelines.evaluation import evaluate
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import DPOSettings, Objective, UpdateRequest
from roll_ma.workers.clients import EnvClient, RolloutClient, RolloutStandIn


@dataclass
class PhaseContext:
    """What every phase works with: the config, the workers, the data cursor, the step, checkpoints."""

    cfg: RunConfig
    plan: RunPlan  # the run's plan: which agents each train step updates
    workers: RunWorkers
    planner: Any
    tracker: Any
    seats: list[str]
    out_dir: Path
    step: int = 0
    results: dict[str, dict[str, float]] = field(default_factory=dict)  # eval metrics by phase name
    signature: dict[str, Any] | None = None  # what each checkpoint records of the config (resume compares it)
    saved_step: int = 0  # the step of the newest checkpoint, written or resumed from
    ahead: dict[str, Any] = field(default_factory=dict)  # metrics for the next step's line (``log_ahead``)

    @property
    def agent_ids(self) -> dict[str, int]:
        return {a.name: i for i, a in enumerate(self.cfg.agents)}

    def phase_dir(self, phase: Phase) -> Path:
        path = self.out_dir / "phases" / phase.name
        path.mkdir(parents=True, exist_ok=True)
        return path

    # ------------------------------------------------------------------ episodes
    def play(
        self, specs: list, greedy: bool = False, rollout: RolloutClient | RolloutStandIn | None = None,
        env: EnvClient | None = None,
    ) -> tuple[DataProto, list[dict]]:
        """Play ``specs`` on the env workers against ``rollout`` (default: the run's, current adapters)."""
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
        """Colocated on a GPU: the rollout engines sleep (``rollout.sleep_level``: 1 or kv_cache; 0 never)
        while the train workers update."""
        level = self.workers.engine_sleep(self.cfg.rollout.sleep_level)
        if level is not None:
            self.workers.rollout.sleep(level)
        try:
            yield
        finally:
            if level is not None:
                self.workers.rollout.wake_up()

    def train(self, rows: DataProto, objective: Objective, dpo: DPOSettings | None = None
              ) -> dict[str, float]:
        """One train step of ``objective`` on ``rows`` (each agent: one optimizer step on its rows)."""
        request = UpdateRequest(step=self.step + 1, temperature=1.0, objective=objective, dpo=dpo,
                                agents=self.plan.due_agents(self.step + 1))
        metrics = self.workers.train.train_step(rows, request).metrics
        self.step += 1
        return metrics

    def sync(self) -> None:
        """Serve the trained adapters in the rollout engines (version = the step that produced them)."""
        trainable = sorted({a.adapter_name for a in self.cfg.agents if not a.frozen})
        if trainable:
            tensors, _ = self.workers.train.export_adapters(trainable, self._sync_dtype())
            self.workers.rollout.update_adapters(tensors, self.step)

    def _sync_dtype(self) -> str | None:
        return adapter_sync_dtype(self.cfg.rollout, self.cfg.model)

    # ------------------------------------------------------------------ bookkeeping
    def log(self, metrics: dict[str, Any]) -> None:
        """``metrics`` into the line of the current step (one line per step). ``phase`` names the phase that
        trained the line's step: what a later phase adds to that line (an eval, its timing) leaves it."""
        if self.tracker.last_step == self.step:
            metrics = {k: v for k, v in metrics.items() if k != "phase"}
        elif self.ahead:  # a new line: the first step after the metrics measured ahead of it
            metrics, self.ahead = {**self.ahead, **metrics}, {}
        self.tracker.log(metrics, self.step)

    def log_ahead(self, metrics: dict[str, Any]) -> None:
        """Metrics of what a phase prepared for its steps (the rows it built): they join the line of the next
        step, or the current line when no step follows."""
        self.ahead.update(metrics)

    def flush_ahead(self) -> None:
        if self.ahead:
            ahead, self.ahead = self.ahead, {}
            self.log(ahead)

    def save_due(self) -> bool:
        """A ``trainer.save_every`` step passed since the last checkpoint. Checkpoints only where asked: those
        steps and the end of the run (a built DPO iteration, a phase's end: when a save step fell in it)."""
        every = self.cfg.trainer.save_every
        return bool(every) and self.step // every > self.saved_step // every

    def save(self, phase: int, progress: dict[str, Any]) -> None:
        """An atomic checkpoint: trainer state, data cursor, the phase to run and its progress."""
        tmp = ckpt.begin_checkpoint(self.out_dir, self.step)
        self.workers.train.save_checkpoint(str(tmp / "trainer"))
        state = {
            "phase": phase,
            "progress": progress,
            "planner": self.planner.state_dict(),
            "results": self.results,
            "config": self.cfg.name,
        }
        ckpt.finish_checkpoint(tmp, self.step, state, self.cfg.trainer.keep_last, self.signature, self.say)
        self.saved_step = self.step

    def say(self, line: str) -> None:
        """One of the run's own lines: on the console and in ``logs/run.log`` (as ``RunSession.say``)."""
        run_line(line, self.out_dir)

    def evaluate(self, label: str) -> dict[str, float]:
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
