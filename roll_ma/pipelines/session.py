"""One run's session, shared by the RL loop (``rl/loop.py``) and the supervised phases
(``phases``): the output folder, Ray, the workers and their models, the resume, the tracker, the teardown.

A run opens it, loads what it needs, and leaves it however it ends::

    with open_session(cfg, plan) as session:   # output folder, Ray, seats, every worker started
        state = start_session(session, train_steps=..., initial_adapters=..., reference_model=...)
        ...                              # the run's own work
    # left: every worker stopped, its GPU bundles released

Resume (``trainer.resume=auto``) takes the newest checkpoint whose files all match its manifest
(``roll_ma/checkpoint.py``); a damaged newer one is named, with the reason, and set aside. What happens to
checkpoints (written, resumed from, set aside, an unfinished one removed) is one line each on the console
and in ``logs/run.log`` (``RunSession.say``).
"""

from __future__ import annotations

import dataclasses
import functools
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import ray

from roll_ma import checkpoint as ckpt
from roll_ma.config.run_plan import RunPlan
from roll_ma.config.schema import RunConfig
from roll_ma.config.seats import resolve_seats
from roll_ma.distributed.ray_env import init_ray
from roll_ma.envs.env_registry import resolve_env_class
from roll_ma.error_report import run_line, run_log
from roll_ma.errors import RunStartError
from roll_ma.interrupts import deferred_stops
from roll_ma.pipelines.clusters import RunWorkers, build_workers, process_env
from roll_ma.pipelines.step_timer import StepTimer
from roll_ma.preflight.checkpoint_compat import run_signature
from roll_ma.tracking import Tracker
from roll_ma.workers.env_worker import env_kwargs
from roll_ma.workers.episodes import EpisodePlanner


@dataclass
class RunSession:
    """What a run works with from its start to its end; leaving it (``with``) stops the workers."""

    cfg: RunConfig  # as the workers run it (``model.random_weights``: model.path is the random model)
    plan: RunPlan  # what the run does (step, critic, reference, agents due), resolved once by run_training
    out_dir: Path
    signature: dict[str, Any]  # what every checkpoint records of the config (resume compares it)
    seats: list[str]
    planner: EpisodePlanner  # draws each step's episodes; its state is checkpointed
    workers: RunWorkers
    startup: StepTimer  # where the time to the first step goes (``startup/<stage>``)
    resume_from: tuple[int, Path] | None  # the checkpoint to resume from: (step, path)
    start_step: int = 0  # the step the run goes on from (the checkpoint's on resume)
    saved: Path | None = None  # the newest checkpoint, written or resumed from
    opened_tracker: Tracker | None = None  # set by start_session

    @property
    def tracker(self) -> Tracker:
        """The run's metric sinks, opened by ``start_session``."""
        if self.opened_tracker is None:
            raise RuntimeError("the session's tracker opens in start_session; call it first")
        return self.opened_tracker

    def say(self, line: str) -> None:
        """One of the run's own lines (``[roll_ma] ...``): on the console and in ``logs/run.log``."""
        run_line(line, self.out_dir)

    def __enter__(self) -> RunSession:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.workers.shutdown()


def open_session(cfg: RunConfig, plan: RunPlan, reference_copies: bool = False,
                 teacher_workers: int = 0) -> RunSession:
    """Prepare the output folder, start Ray and every worker (models are loaded by ``start_session``);
    ``plan``: the run's plan (``config.run_plan``), which the session holds for every stage to read.

    ``reference_copies`` and ``teacher_workers``: as ``build_workers`` takes them (DPO, a teacher)."""
    startup = StepTimer("startup")  # started now: startup/total is the time to the first step
    out_dir = Path(cfg.trainer.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    say = functools.partial(run_line, output_dir=out_dir)  # RunSession.say, before there is a session
    # the newest checkpoint that matches its manifest; damaged newer ones are reported and set aside
    resume_from = ckpt.resume_checkpoint(out_dir, say) if cfg.trainer.resume == "auto" else None
    if cfg.trainer.resume == "never":
        set_aside_previous_run(out_dir)
    ckpt.prune(out_dir, cfg.trainer.keep_last, say)  # drops (and names) temporaries of a killed write
    signature = run_signature(cfg)  # before random_weights rewrites model.path
    if cfg.model.random_weights:
        # imported only here: it builds a model, which a run on real weights never needs
        from roll_ma.models.random_weights import use_random_weights

        with startup("random_weights"):
            cfg = use_random_weights(cfg)  # model.path -> a random model of that architecture, built once
    with startup("ray"), deferred_stops():  # a stop inside ray.init left a half-built Ray: raised after it
        init_ray(cfg.resources.ray_address, env_vars=process_env(cfg), log_file=run_log(out_dir))
    check_cluster_gpus(cfg)
    check_cluster_cpus(cfg)
    seats = resolve_seats(cfg, num_players(cfg))
    planner = EpisodePlanner(cfg.env, cfg.seed)
    with startup("workers"):
        workers = build_workers(cfg, plan, seats, reference_copies, teacher_workers)
    return RunSession(cfg, plan, out_dir, signature, seats, planner, workers, startup, resume_from)


def start_session(
    session: RunSession, train_steps: int | None, initial_adapters: bool, reference_model: bool
) -> dict[str, Any] | None:
    """Load the models, resume from the session's checkpoint (if any), open the tracker; returns the
    checkpoint's state (None on a fresh start).

    ``train_steps``: the lr decay horizon in optimizer steps per adapter (None: the trainer's default).
    ``initial_adapters=False``: the engines serve nothing until the run's first sync.
    ``reference_model``: load the reference workers' model (the RL loop scores with it; phases do not).
    """
    workers, startup = session.workers, session.startup
    with startup("train_model"):
        workers.train.init_model(total_steps=train_steps)
    with startup("rollout_engine"):
        workers.rollout.init_model(initial_adapters=initial_adapters)
    if reference_model and workers.reference is not None:
        with startup("reference_model"):
            workers.reference.init_model()
    state = None
    if session.resume_from is not None:
        session.start_step, session.saved = session.resume_from
        with startup("resume"):
            workers.train.load_checkpoint(str(session.saved / "trainer"))
        state = ckpt.load_state(session.saved)
        session.planner.load_state_dict(state["planner"])
    cfg = session.cfg
    session.opened_tracker = Tracker(
        session.out_dir,
        cfg.tracking,
        cfg.name,
        dataclasses.asdict(cfg),
        resume_step=session.start_step if state is not None else None,
    )
    return state


def done_line(checkpoint: Path | None, metrics_path: Path, plot: Path | None) -> str:
    """The run's last line: where its checkpoint, metrics and plot are."""
    parts = [f"checkpoint {checkpoint}" if checkpoint else "no checkpoint", f"metrics {metrics_path}"]
    return "[roll_ma] done: " + ", ".join(parts + ([f"plot {plot}"] if plot else []))


def num_players(cfg: RunConfig) -> int:
    """The env's seats: one per agent for a workflow, else what the env class says it has."""
    if cfg.env.workflow:  # every agent is its own "seat" of a workflow
        return len(cfg.agents)
    env = resolve_env_class(cfg.env.name)(**{**env_kwargs(cfg.env, cfg.agents, None), "seat_agents": None})
    return env.num_players


def check_cluster_gpus(cfg: RunConfig) -> None:
    have = int(ray.cluster_resources().get("GPU", 0))
    if cfg.resources.num_gpus > have:
        raise RunStartError(
            f"resources.num_gpus={cfg.resources.num_gpus} but the Ray cluster has {have} GPUs; "
            "lower it or add GPU nodes"
        )


def check_cluster_cpus(cfg: RunConfig) -> None:
    """Every actor asks for ``num_cpus_per_worker`` CPUs on one node: more than the largest node has would
    leave them all waiting until the start timeout, with only Ray's autoscaler lines to say why."""
    largest = max((n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")), default=0.0)
    ask = cfg.resources.num_cpus_per_worker
    if ask > largest:
        raise RunStartError(
            f"resources.num_cpus_per_worker={ask:g} but the largest node of the Ray cluster has {largest:g} "
            "CPUs, so no worker could start; lower it (default 0.1) or add larger nodes"
        )


def set_aside_previous_run(out_dir: Path) -> None:
    """resume=never: move an earlier run's files aside instead of mixing them with the new run."""
    old = [p for p in (out_dir / "checkpoints", out_dir / "metrics.jsonl", out_dir / "phases") if p.exists()]
    if old:
        dest = out_dir / f"previous_{time.strftime('%Y%m%d_%H%M%S')}"
        dest.mkdir()
        for p in old:
            shutil.move(str(p), dest / p.name)
        print(f"[roll_ma] trainer.resume=never: moved the previous run's files to {dest}", flush=True)
