"""Build the Ray clusters of one run: rollout, train, reference (optional) and env workers, and a teacher;
the pipelines call each role through its typed client (``workers/clients.py``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Literal, cast

from roll_ma.config.run_plan import RunPlan, prompt_sharing_note
from roll_ma.config.schema import ModelConfig, RolloutConfig, RunConfig
from roll_ma.distributed.cluster import Cluster, shutdown_clusters
from roll_ma.distributed.progress import ENV_FLAG as PROGRESS_FLAG
from roll_ma.distributed.resources import ResourceManager
from roll_ma.distributed.shm_transfer import remove_orphans
from roll_ma.inference.infer_backend import SleepLevel
from roll_ma.preflight.validate_resources import gpus_per_worker
from roll_ma.registry import StudyPlugs
from roll_ma.training.ds_utils import SHARERS_VAR
from roll_ma.training.micro_batches import MicroBatching
from roll_ma.training.update_loop import LossTermMaker
from roll_ma.workers.clients import EnvClient, ReferenceClient, RefScorer, RolloutClient, TrainClient
from roll_ma.workers.worker_specs import (
    EnvWorkerSpec,
    ReferenceWorkerSpec,
    RolloutWorkerSpec,
    TrainWorkerSpec,
    WorkflowWorkerSpec,
)


@dataclass
class RunWorkers:
    """The run's roles, each behind its typed client (its ``Cluster`` is the client's ``cluster``)."""

    rollout: RolloutClient
    train: TrainClient
    reference: ReferenceClient | None
    env: EnvClient
    resources: ResourceManager

    @property
    def ref_source(self) -> RefScorer:
        """Who computes reference log-probs: the reference workers, or the train workers (adapters off)."""
        return self.reference if self.reference is not None else self.train

    def colocated(self) -> bool:
        return self.resources.colocated("rollout", "train")

    def engine_sleep(self, level: Literal[0, 1, "kv_cache"]) -> SleepLevel | None:
        """How the rollout engines sleep while the trainer works (``rollout.sleep_level``): None where they
        never do (level 0, or a GPU of their own)."""
        return level if level != 0 and self.colocated() else None

    def shutdown(self) -> None:
        shutdown_clusters(_clusters(self.env, self.rollout, self.reference, self.train))  # one wait for all
        self.resources.release()


def _clusters(*clients: Any) -> list[Cluster]:
    """The Clusters behind a run's clients (``build_workers`` builds every client on one)."""
    return [cast(Cluster, c.cluster) for c in clients if c is not None]


def worker_env(cfg: RunConfig) -> dict[str, str]:
    env = {"TOKENIZERS_PARALLELISM": "false", PROGRESS_FLAG: "1" if cfg.trainer.progress_bars else "0"}
    if cfg.resources.num_gpus == 0:
        env["DS_ACCELERATOR"] = "cpu"  # DeepSpeed picks gloo on CPU only when told it has no GPU
    return env


def process_env(cfg: RunConfig) -> dict[str, str]:
    """Variables every actor process must have when it starts (libraries read them on import)."""
    env = {}
    if cfg.resources.num_gpus == 0 and "OMP_WAIT_POLICY" not in os.environ:
        # OpenMP's default spin-wait keeps a worker's idle threads busy on the cores that another role (the
        # rollout beside the trainer: docs/studies/async_staleness) or another run on the machine needs: two
        # tiny CPU runs at once took 5-10x longer per update (docs/benchmarks.md, "Two runs on one machine")
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def cpu_sharers(cfg: RunConfig, plan: RunPlan, role: str) -> int:
    """How many of the run's workers compute at the same time as one of ``role`` (CPU runs): each takes
    that share of its node's cores as torch / OpenMP threads (``ds_utils.use_cpu_threads``). The ranks of
    a role compute together; rollouts and the update also overlap with ``rollout.max_staleness`` > 0."""
    counts = {"train": cfg.train.num_workers, "rollout": cfg.rollout.num_workers,
              "reference": plan.reference_workers}
    if cfg.rollout.max_staleness > 0 and role in ("train", "rollout"):
        return counts["train"] + counts["rollout"]
    return max(1, counts.get(role, 1))


def cpu_placement(cfg: RunConfig) -> ResourceManager:
    """Placement of the CPU-only roles (env workers): CPUs, and the nodes resources.role_resources names."""
    return ResourceManager.cpu_only(cfg.resources.num_cpus_per_worker, cfg.resources.role_resources)


def build_workers(cfg: RunConfig, plan: RunPlan, seats: list[str], reference_copies: bool = False,
                  teacher_workers: int = 0) -> RunWorkers:
    """Create every actor (models are loaded by init_model calls, which the pipeline makes); ``plan``: the
    run's plan (reference actors, prompt sharing).

    ``reference_copies``: the train workers also hold a frozen copy of every trainable adapter (DPO).
    ``teacher_workers``: GPU bundles are reserved for a teacher's rollout workers, which
    ``build_teacher`` starts when a phase needs them. If any cluster fails to start, the ones already
    started are killed and the GPU bundles released.
    """
    from roll_ma.workers.env_worker import EnvWorker
    from roll_ma.workers.reference_worker import ReferenceWorker
    from roll_ma.workers.rollout_worker import RolloutWorker
    from roll_ma.workers.train_worker import TrainWorker
    from roll_ma.workers.workflow_worker import WorkflowWorker

    remove_orphans()  # what a killed run on this machine left in /dev/shm (each worker sweeps its node too)
    # reference actors: reference.mode=worker, and a loss that reads reference log-probs (the KL term,
    # algorithm.kl_coef > 0). With kl_coef=0 no pass reads them, so no actor holds a model for them
    ref_workers = plan.reference_workers
    resources = ResourceManager.from_config(
        cfg.resources,
        {"rollout": cfg.rollout.num_workers, "train": cfg.train.num_workers, "reference": ref_workers,
         "teacher": teacher_workers},
        gpus_per_worker(cfg),
    )
    env = worker_env(cfg)
    note = prompt_sharing_note(cfg.train, cfg.model.attn_implementation)  # where auto turned itself off
    if note:
        print(note, flush=True)
    built: list[Cluster] = []

    def cluster(role: str, cls: type, n: int, res: ResourceManager, init_kwargs: dict) -> Cluster:
        cpu = cfg.resources.num_gpus == 0
        role_env = {**env, SHARERS_VAR: str(cpu_sharers(cfg, plan, role))} if cpu else env
        built.append(Cluster(role, cls, n, res, env_vars=role_env, init_kwargs=init_kwargs,
                             start_timeout_s=cfg.resources.actor_start_timeout_s,
                             stall_timeout_s=cfg.trainer.stall_timeout_s, wait=False))
        return built[-1]

    try:
        train = cluster(
            "train",
            TrainWorker,
            cfg.train.num_workers,
            resources,
            {"spec": train_worker_spec(cfg, plan, reference_copies)},
        )
        rollout = cluster(
            "rollout",
            RolloutWorker,
            cfg.rollout.num_workers,
            resources,
            {"spec": rollout_worker_spec(cfg, cfg.model, cfg.rollout, agents=True)},
        )
        scoring = MicroBatching.for_scoring(plan.worker_train_config(cfg.train))  # as the train workers score
        ref_kwargs = {"spec": ReferenceWorkerSpec(model=cfg.model, batching=scoring)}
        reference = (
            cluster("reference", ReferenceWorker, ref_workers, resources, ref_kwargs) if ref_workers else None
        )
        envs = cluster(
            "env",
            WorkflowWorker if cfg.env.workflow else EnvWorker,
            cfg.env.num_workers,
            cpu_placement(cfg),
            {"spec": env_worker_spec(cfg, seats, cfg.model)},
        )
        for started in built:  # every role's actors were asked for at once: their imports overlap
            started.wait_started()
    except BaseException:
        shutdown_clusters(built)
        resources.release()
        raise
    ref_client = ReferenceClient(reference) if reference is not None else None
    workers = RunWorkers(RolloutClient(rollout), TrainClient(train), ref_client, EnvClient(envs), resources)
    report = placement_report(workers)
    if report:
        print(report, flush=True)
    return workers


# the PPO loss terms a study adds (RunPlan.loss_terms -> the term's maker): the core imports no study;
# ``roll_ma.studies`` registers its terms when imported ("action_entropy")
STUDY_LOSS_TERMS: StudyPlugs[LossTermMaker] = StudyPlugs("PPO loss term")


def study_loss_terms(names: tuple[str, ...]) -> tuple[LossTermMaker, ...]:
    """The makers of the loss terms ``names`` (the run plan's), as ``roll_ma.studies`` registered them."""
    return tuple(STUDY_LOSS_TERMS.get(name, "study.action_entropy_coef > 0") for name in names)


def train_worker_spec(cfg: RunConfig, plan: RunPlan, reference_copies: bool) -> TrainWorkerSpec:
    """What a train worker is built with (``reference_copies``: a frozen copy of each adapter, DPO): the
    train block as the plan resolved it (prompt sharing decided); which agents train at a step comes with
    each update request (``RunPlan.due_agents``). Every setting named: a forgotten one fails here."""
    return TrainWorkerSpec(
        model=cfg.model,
        lora=cfg.lora,
        agents=tuple(cfg.agents),
        train=plan.worker_train_config(cfg.train),
        algorithm=cfg.algorithm,
        critic=cfg.critic,
        study=cfg.study,
        loss_terms=study_loss_terms(plan.loss_terms),
        seed=cfg.seed,
        reference_copies=reference_copies,
    )


def rollout_worker_spec(cfg: RunConfig, model: ModelConfig, rollout: RolloutConfig,
                        agents: bool) -> RolloutWorkerSpec:
    """What a rollout worker is built with: the run's engines (``agents``: every agent's adapter) or a
    teacher's (its own model and rollout block, no adapters)."""
    return RolloutWorkerSpec(model=model, lora=cfg.lora, agents=tuple(cfg.agents) if agents else (),
                             rollout=rollout, seed=cfg.seed)


def env_worker_spec(cfg: RunConfig, seats: list[str],
                    model: ModelConfig) -> EnvWorkerSpec | WorkflowWorkerSpec:
    """What an env worker (or, with ``env.workflow``, a workflow worker) is built with; ``model``: whose
    tokenizer renders the prompts (the run's, or a teacher's)."""
    if cfg.env.workflow:
        return WorkflowWorkerSpec(env=cfg.env, model=model, agents=tuple(cfg.agents), seed=cfg.seed)
    return EnvWorkerSpec(env=cfg.env, model=model, agents=tuple(cfg.agents), seats=tuple(seats),
                         seed=cfg.seed, action_choices=cfg.study.action_entropy_coef > 0)


def placement_report(workers: RunWorkers) -> str | None:
    """Which node every worker runs on, when the run spans several nodes (None on one node)::

        [roll_ma] placement over 2 nodes: node 3f2a9c1e (10.0.0.5): rollout 0, env 0; node 8b0d...: train 0
    """
    import ray

    where: dict[str, list[str]] = {}
    for c in (workers.rollout, workers.train, workers.reference, workers.env):
        if c is not None:
            for rank, node in enumerate(c.node_ids()):
                where.setdefault(node, []).append(f"{c.cluster.role} {rank}")
    if len(where) < 2:
        return None
    ips = {n["NodeID"]: n.get("NodeManagerAddress", "?") for n in ray.nodes()}
    nodes = "; ".join(f"node {node[:8]} ({ips.get(node, '?')}): {', '.join(names)}"
                      for node, names in where.items())
    return f"[roll_ma] placement over {len(where)} nodes: {nodes}"


@dataclass
class TeacherWorkers:
    """A teacher: rollout workers serving its model without adapters, and env workers that render and
    tokenize prompts for it (its tokenizer may differ from the run's)."""

    rollout: RolloutClient
    env: EnvClient

    def shutdown(self) -> None:
        shutdown_clusters(_clusters(self.env, self.rollout))


def build_teacher(cfg: RunConfig, seats: list[str], resources: ResourceManager) -> TeacherWorkers:
    """Start the teacher's clusters (on the ``teacher`` GPUs of ``resources``) and load its model."""
    from roll_ma.workers.env_worker import EnvWorker
    from roll_ma.workers.rollout_worker import RolloutWorker

    env = worker_env(cfg)
    model = cfg.teacher.model
    spec = rollout_worker_spec(cfg, model, cfg.teacher.rollout, agents=False)
    rollout = Cluster("teacher", RolloutWorker, cfg.teacher.rollout.num_workers, resources, env_vars=env,
                      init_kwargs={"spec": spec}, wait=False)
    envs = None
    try:
        envs = Cluster("teacher_env", EnvWorker, cfg.env.num_workers, cpu_placement(cfg), wait=False,
                       env_vars=env, init_kwargs={"spec": teacher_env_spec(cfg, seats)})
        rollout.wait_started()  # both clusters' actors start at once
        envs.wait_started()
    except BaseException:
        shutdown_clusters([rollout, envs], close_timeout_s=0)
        raise
    teacher = TeacherWorkers(RolloutClient(rollout), EnvClient(envs))
    try:
        teacher.rollout.init_model()
    except BaseException:
        teacher.shutdown()
        raise
    return teacher


def teacher_env_spec(cfg: RunConfig, seats: list[str]) -> EnvWorkerSpec:
    """The teacher's env workers: the run's env rendered with the teacher's tokenizer; no legal actions
    tokenized (its rows train no action bonus)."""
    return EnvWorkerSpec(env=cfg.env, model=cfg.teacher.model, agents=tuple(cfg.agents), seats=tuple(seats),
                         seed=cfg.seed, action_choices=False)
