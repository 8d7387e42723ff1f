"""TrainWorker: one data-parallel rank of the policy update; owns a train strategy chosen by name.

Every rank holds the whole model and all adapters. ``train_step`` goes to every rank with
the full batch (each takes its share); scoring is split across ranks (dp_compute).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import torch

from roll_ma.distributed.shm_transfer import SegmentOwner
from roll_ma.distributed.worker import Dispatch, Worker, register
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import PairReference, ScoreRequest, UpdateRequest, UpdateResult
from roll_ma.training.train_backend import (
    DPOCapable,
    PhaseCapable,
    TrainBackend,
    missing_capability,
)
from roll_ma.workers.worker_specs import TrainWorkerSpec

# what each optional capability offers and which part of a config calls for it (its error names both)
DPO = ("DPOCapable", "compute_pair_ref_log_probs, snapshot_reference", "a dpo phase")
PHASES = ("PhaseCapable", "reset_optimizers", "phases")


class TrainWorker(Worker):
    """A train rank: ``init_model`` builds ``spec.train.strategy``; the methods score, update, export, save.

    Built from one ``TrainWorkerSpec`` (``spec``, every setting named; the driver makes it): nothing is
    filled in with a default here. Reference log-probs with ``reference.mode=train_worker`` come from this
    worker with every adapter disabled (``compute_ref_log_probs``): no second copy of the model.
    """

    def __init__(self, role: str, rank: int = 0, world_size: int = 1, env_vars: dict[str, str] | None = None,
                 *, spec: TrainWorkerSpec):
        if not isinstance(spec, TrainWorkerSpec):  # a dict of settings: TrainWorkerSpec.from_settings
            raise TypeError(f"a train worker is built from a TrainWorkerSpec, got {type(spec).__name__}")
        super().__init__(role, rank, world_size, env_vars)
        self.spec = spec
        self.strategy: TrainBackend | None = None
        self._segments = SegmentOwner(self.node_id())  # shared-memory exports of adapters (same node)

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, total_steps: int | None = None) -> None:
        """Load the base, inject the adapters and build the engines (``total_steps``: lr decay horizon)."""
        from roll_ma.models.adapters import plan_adapters
        from roll_ma.training import train_strategy_class
        from roll_ma.training.ds_utils import use_cpu_threads

        if not torch.cuda.is_available():
            use_cpu_threads(self.world_size)  # oversubscribed threads slow every worker on the machine down
        spec = self.spec
        agent_specs, adapter_specs = plan_adapters(spec.lora, spec.agents)
        cls = train_strategy_class(spec.train.strategy)
        # a study's loss terms only where a run has some: a user's backend written before them still builds
        terms = {"loss_terms": spec.loss_terms} if spec.loss_terms else {}
        strategy: TrainBackend = cls(
            spec.model, agent_specs, adapter_specs, spec.train, spec.algorithm, spec.seed, self.rank,
            self.world_size, reference_copies=spec.reference_copies, study_cfg=spec.study,
            critic_cfg=spec.critic, **terms,
        )
        check_capabilities(strategy, spec.train.strategy, spec.reference_copies)
        strategy.initialize(total_steps=total_steps)
        self.strategy = strategy

    def _strategy(self) -> TrainBackend:
        if self.strategy is None:
            raise RuntimeError(f"{self.role} rank {self.rank}: call init_model() first")
        return self.strategy

    def _phases(self) -> PhaseCapable:
        strategy = self._strategy()
        if not isinstance(strategy, PhaseCapable):
            raise missing_capability(self.spec.train.strategy, *PHASES)
        return strategy

    def _dpo(self) -> DPOCapable:
        strategy = self._strategy()
        if not isinstance(strategy, DPOCapable):
            raise missing_capability(self.spec.train.strategy, *DPO)
        return strategy

    @register(Dispatch.DP_BALANCED)
    def compute_log_probs(self, data: DataProto, request: ScoreRequest) -> DataProto:
        """``old_log_probs`` (B, R): each row scored with its agent's adapter at the request's temperature."""
        out = self._strategy().compute_log_probs(data, adapters_enabled=True, temperature=request.temperature)
        _release_cached_gpu_memory()
        return out

    @register(Dispatch.DP_BALANCED)
    def compute_ref_log_probs(self, data: DataProto, request: ScoreRequest) -> DataProto:
        """``ref_log_probs`` (B, R) from the base weights (every adapter disabled)."""
        strategy = self._strategy()
        out = strategy.compute_log_probs(data, adapters_enabled=False, temperature=request.temperature)
        _release_cached_gpu_memory()
        return out

    @register(Dispatch.DP_BALANCED)
    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, R): each row under its agent's critic (algorithm.advantage=gae), forward only."""
        out = self._strategy().compute_values(data)
        _release_cached_gpu_memory()
        return out

    @register(Dispatch.ONE_TO_ALL)
    def train_step(self, data: DataProto, request: UpdateRequest) -> UpdateResult:
        """One update of every due agent from the FULL batch (each rank takes its share); the same result
        on every rank (what took a step, the metrics), with this worker's GPU memory in its metrics."""
        result = self._strategy().train_step(data, request)
        metrics = result.metrics
        if torch.cuda.is_available():
            peak, now = torch.cuda.max_memory_reserved(), torch.cuda.memory_reserved()
            free, total = torch.cuda.mem_get_info()
            metrics["system/train_gpu_peak_gb"] = peak / 1024**3
            # the whole GPU at this worker's peak: what other processes hold (a sleeping engine) + our peak
            metrics["system/gpu_peak_gb_update"] = (total - free - now + peak) / 1024**3
            torch.cuda.reset_peak_memory_stats()
        _release_cached_gpu_memory()
        return result

    @register(Dispatch.DP_BALANCED)
    def compute_pair_ref_log_probs(self, data: DataProto, reference: PairReference) -> DataProto:
        """DPO pairs: (N,) ``ref_chosen_logps`` / ``ref_rejected_logps`` under ``reference``: "copy" (each
        agent's frozen adapter copy) or "base" (adapters off)."""
        out = self._dpo().compute_pair_ref_log_probs(data, reference)
        _release_cached_gpu_memory()
        return out

    @register(Dispatch.ONE_TO_ALL)
    def snapshot_reference(self) -> list[str]:
        """Freeze every trainable adapter as it is now into its reference copy (a DPO phase starts)."""
        return self._dpo().snapshot_reference()

    @register(Dispatch.ONE_TO_ALL)
    def reset_optimizers(self, lr: float | None = None) -> None:
        """A fresh optimizer and lr schedule for every trainable adapter (a training phase starts), peaking
        at ``lr`` if given."""
        self._phases().reset_optimizers(lr)

    @register(Dispatch.RANK_ZERO)
    def flops_profile(self) -> dict[str, Any]:
        """What MFU needs (``models/flops.py``): the model's shape and this GPU's dense bf16 peak (0: no
        GPU, or one the table does not know)."""

        from roll_ma.models.flops import ModelShape, peak_flops

        model = self._strategy().model
        config = getattr(model, "config", None) or model.get_base_model().config
        name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
        return {"shape": dataclasses.asdict(ModelShape.of(config)), "device": name,
                "peak_flops": (peak_flops(name) or 0.0) if torch.cuda.is_available() else 0.0}

    @register(Dispatch.RANK_ZERO)
    def gpu_memory_used_gb(self) -> float:
        """Device-wide GPU memory in use now, every process on rank 0's GPU (a colocated engine too)."""
        if not torch.cuda.is_available():
            return 0.0
        free, total = torch.cuda.mem_get_info()
        return (total - free) / 1024**3

    @register(Dispatch.RANK_ZERO)
    def score_with(self, scorer: Callable[[TrainBackend, DataProto], DataProto],
                   data: DataProto) -> DataProto:
        """A study's forward-only pass over the policies (``scorer(backend, data)``, e.g. the joint search's
        scores of a game's legal answers: a few dozen prompts, so rank 0 alone). The study's function comes
        with the call (Ray imports its module here): the worker imports no study itself."""
        return scorer(self._strategy(), data)

    @register(Dispatch.ONE_TO_ALL)
    def train_with(self, trainer: Callable[..., dict[str, float]], data: DataProto,
                   *args: Any) -> dict[str, float]:
        """A study's update of the policies on every rank (``trainer(backend, data, *args)``, e.g. the joint
        search's distillation), returning its metrics."""
        metrics = trainer(self._strategy(), data, *args)
        _release_cached_gpu_memory()
        return metrics

    @register(Dispatch.RANK_ZERO)
    def adapter_tensors(self, adapters: list[str] | None = None) -> dict[str, dict[str, torch.Tensor]]:
        """The adapters' PEFT-format CPU tensors, to the caller (checks; the sync uses export_adapters)."""
        return self._strategy().adapter_tensors(adapters)

    @register(Dispatch.RANK_ZERO)
    def export_adapters(self, adapters: list[str] | None = None, dtype: str | None = None,
                        transport: str = "ray") -> list[Any]:
        """The adapters packed for the rollout engines, cast to ``dtype`` if given: ``[payload, seconds]``.

        ``transport="ray"``: one ``PackedTensors`` per adapter put into Ray's object store by this worker
        (payload = the ref): the rollout workers read it from there, on any node, and the adapters never
        pass through the driver. ``"shm"`` (rollout workers on this node): each adapter is copied off the
        GPU straight into a shared-memory file and the payload is the files' names (tiny); they live
        until ``release_exports`` names them. The list keeps Ray from resolving the ref on its way back.
        """
        import ray

        start = time.perf_counter()
        if transport == "shm":
            payload = self._strategy().adapter_tensors(adapters, packed=True, dtype=dtype,
                                                       shared=self._segments)
            return [payload, time.perf_counter() - start]
        if transport != "ray":
            raise ValueError(f"export transport must be 'ray' or 'shm', got {transport!r}")
        ref = ray.put(self._strategy().adapter_tensors(adapters, packed=True, dtype=dtype))
        return [ref, time.perf_counter() - start]

    @register(Dispatch.ONE_TO_ALL)
    def train_and_export(self, data: DataProto, policy: str, request: UpdateRequest, dtype: str | None = None,
                         transport: str = "ray") -> list[Any]:
        """Update one policy (adapter) from its agents' rows, then export it if it changed: the streaming
        sync's unit of work. Every rank trains; rank 0 returns ``[result, payload, seconds]`` (payload
        as ``export_adapters``; None when the policy took no optimizer step), the others ``[result]``."""
        result = self.train_step(data, dataclasses.replace(request, policies=(policy,)))
        if self.rank != 0:
            return [result]
        if policy not in result.updated_adapters:
            return [result, None, 0.0]
        return [result, *self.export_adapters([policy], dtype, transport)]

    def close(self) -> None:
        self._segments.release()  # exports no engine has read yet

    @register(Dispatch.RANK_ZERO)
    def release_exports(self, segments: list[str] | None = None) -> int:
        """Delete the shared-memory files of exports the engines have installed (None: all of them)."""
        return self._segments.release(segments)

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, ckpt_dir: str) -> None:
        self._strategy().save_checkpoint(ckpt_dir)

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, ckpt_dir: str) -> None:
        self._strategy().load_checkpoint(ckpt_dir)


def check_capabilities(backend: TrainBackend, strategy: str, reference_copies: bool) -> None:
    """Refuse, before any model is built, a backend that lacks a capability this run's config calls for
    (a phase's optimizer reset is checked when a phase starts: the worker does not see the phases; a study's
    pass checks the backend it is given, ``roll_ma/studies``)."""
    if reference_copies and not isinstance(backend, DPOCapable):  # frozen copies: only DPO asks for them
        raise missing_capability(strategy, *DPO)


def _release_cached_gpu_memory() -> None:
    """Hand cached blocks back to the GPU: a colocated vLLM engine wakes up into that memory next."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
