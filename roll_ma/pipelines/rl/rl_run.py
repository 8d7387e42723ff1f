"""What every step of an RL run works with (``RLRun``), set up once after the session's models are loaded:
the adapter sync and the first push, the train rollouts, the model shape for MFU, and which adapter
version each engine serves."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from roll_ma.algorithms.advantages import RowWeights
from roll_ma.config.run_plan import RunPlan
from roll_ma.config.schema import RunConfig
from roll_ma.inference.infer_backend import SleepLevel
from roll_ma.models.flops import ModelShape
from roll_ma.pipelines.clusters import RunWorkers
from roll_ma.pipelines.rl.adapter_sync import AdapterSync
from roll_ma.pipelines.rl.rollout_queue import RolloutQueue
from roll_ma.pipelines.session import RunSession
from roll_ma.registry import StudyPlugs

# step_hook(workers, step): runs after each step's work; what it returns joins that step's metrics
# (benchmarks use it to probe the workers; training never needs it)
StepHook = Callable[[RunWorkers, int], "dict[str, float] | None"]
# the advantage weights a study adds (RunPlan.advantage_weights -> its RowWeights): the core imports no
# study; ``roll_ma.studies`` registers them when imported ("balance_reward_classes")
STUDY_ADVANTAGE_WEIGHTS: StudyPlugs[RowWeights] = StudyPlugs("advantage weights")


def study_advantage_weights(name: str | None) -> RowWeights | None:
    """The weights the run plan names (``RunPlan.advantage_weights``), as ``roll_ma.studies`` registered."""
    return None if name is None else STUDY_ADVANTAGE_WEIGHTS.get(name, f"study.{name}")


@dataclass
class RLRun:
    """One RL run's parts and the adapter versions the engines serve; the steps read and advance it."""

    session: RunSession
    sync: AdapterSync  # pushes updated adapters into every engine
    rollouts: RolloutQueue  # the train rollouts (one step ahead with rollout.max_staleness > 0)
    shape: ModelShape  # the model's shape: FLOPs of every pass
    peak_flops: float  # the GPU's peak (0: unknown), for MFU
    gpus: dict[str, int]  # GPUs that run each pass, for MFU per GPU
    engine_sleep: SleepLevel | None  # how the engine frees GPU memory while the trainer works (None: never)
    served: dict[str, int]  # adapter -> the version (step of its update) the engines serve
    advantage_weights: RowWeights | None = None  # a study's weights of the advantages (the plan's)
    step_hook: StepHook | None = None

    @property
    def cfg(self) -> RunConfig:
        return self.session.cfg

    @property
    def plan(self) -> RunPlan:
        return self.session.plan

    @property
    def workers(self) -> RunWorkers:
        return self.session.workers

    @property
    def shares_prompts(self) -> bool:
        """The scoring and update passes run a group's prompt once (their FLOPs, for MFU)."""
        return self.plan.shares_prompts

    @property
    def agent_names(self) -> list[str]:
        return [a.name for a in self.cfg.agents]

    @property
    def adapter_of_agent(self) -> list[str]:
        return [a.adapter_name for a in self.cfg.agents]

    @property
    def trainable(self) -> set[str]:
        return {a.adapter_name for a in self.cfg.agents if not a.frozen}

    @property
    def train_order(self) -> list[str]:
        """The trainable adapters in the agents' order: the streamed update goes through them one by one."""
        return list(dict.fromkeys(a.adapter_name for a in self.cfg.agents if not a.frozen))

    def expected_versions(self) -> dict[int, int]:
        """Agent id -> the adapter version its next rows must report (what the engines serve now)."""
        return {i: self.served[a.adapter_name] for i, a in enumerate(self.cfg.agents)}

    def mark_served(self, adapters: Iterable[str], step: int) -> None:
        self.served.update({a: step for a in adapters})


def prepare_rl_run(session: RunSession, step_hook: StepHook | None = None) -> RLRun:
    """Set up the steps' parts on a started session, and push the trainer's adapters into every engine
    (version = the step whose update produced them: the checkpoint's step on resume, else 0)."""
    cfg, workers, start = session.cfg, session.workers, session.start_step
    advantage_weights = study_advantage_weights(session.plan.advantage_weights)  # before any work
    profile = workers.train.flops_profile()  # model shape and GPU peak: MFU of every pass
    gpus = {"reference": workers.ref_source.world_size, "old_log_probs": cfg.train.num_workers,
            "values": cfg.train.num_workers, "update": cfg.train.num_workers}
    sync = AdapterSync(cfg, workers.train, workers.rollout)
    adapters = {a.adapter_name for a in cfg.agents}
    with session.startup("first_sync"):
        sync.push(adapters, start)
    trainable = {a.adapter_name for a in cfg.agents if not a.frozen}
    return RLRun(
        session=session,
        sync=sync,
        # max_staleness 0: roll out, then train. k >= 1: step s + 1's rollout plays while step s trains
        rollouts=RolloutQueue(workers, session.planner, ahead=cfg.rollout.max_staleness > 0),
        shape=ModelShape(**profile["shape"]),
        peak_flops=profile["peak_flops"],
        gpus=gpus,
        engine_sleep=workers.engine_sleep(cfg.rollout.sleep_level),
        served={a: (start if a in trainable else 0) for a in adapters},
        advantage_weights=advantage_weights,
        step_hook=step_hook,
    )
