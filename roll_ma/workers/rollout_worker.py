"""Rollout worker: one rank of the rollout role, owning one inference strategy (hf or vllm).

Every rank serves every agent's adapter. ``generate`` and ``score`` are data-parallel (the
Cluster splits the rows across ranks and concatenates the pieces); adapter updates, version
reports and sleep/wake go to every rank.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from roll_ma.distributed.worker import Dispatch, Worker, register
from roll_ma.inference.infer_backend import InferBackend, SleepLevel
from roll_ma.models.adapters import plan_adapters
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import GenerateRequest
from roll_ma.workers.worker_specs import RolloutWorkerSpec, expect_spec

logger = logging.getLogger(__name__)


class RolloutWorker(Worker):
    """Generates responses for rows of any agent with that agent's newest adapter.

    Built from one ``RolloutWorkerSpec`` (``spec``: the base model, the LoRA block, the agents, the rollout
    block, the seed; every setting named, the driver makes it): nothing is filled in with a default here.
    ``role, rank, world_size, env_vars``: see ``Worker``.
    """

    def __init__(self, role: str, rank: int = 0, world_size: int = 1, env_vars: dict[str, str] | None = None,
                 *, spec: RolloutWorkerSpec):
        expect_spec(spec, RolloutWorkerSpec)
        super().__init__(role, rank, world_size, env_vars)
        self.spec = spec
        self.model_cfg, self.lora_cfg, self.rollout_cfg = spec.model, spec.lora, spec.rollout
        self.seed = spec.seed
        self.agent_specs, self.adapter_specs = plan_adapters(spec.lora, list(spec.agents))
        self.strategy: InferBackend | None = None
        self._last_sync: dict[str, float] = {}

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self, initial_adapters: bool = True) -> None:
        """Start the backend. ``initial_adapters=False``: serve nothing until the first
        ``update_adapters`` (the pipeline pushes the trainer's adapters right away, so the engine need
        not draw version 0 itself: at 7B that means loading the base on the CPU once more)."""
        import torch

        from roll_ma.inference import infer_strategy_class

        device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cpu":
            from roll_ma.training.ds_utils import use_cpu_threads

            use_cpu_threads(self.world_size)  # oversubscribed threads slow every worker on the machine down
        cls = infer_strategy_class(self.rollout_cfg.backend)
        strategy: InferBackend = cls(
            self.model_cfg, self.rollout_cfg, self.agent_specs, self.adapter_specs, self.seed, device
        )
        strategy.initialize(initial_adapters=initial_adapters)
        self.strategy = strategy
        logger.info("rollout rank %d: %s ready on %s", self.rank, self.rollout_cfg.backend, device)

    @register(Dispatch.DP_COMPUTE)
    def generate(self, data: DataProto, request: GenerateRequest) -> DataProto:
        """Responses for this rank's rows, sampled as ``request`` says (the Cluster re-pads rows of several
        ranks to common widths)."""
        return self._ready().generate(data, request)

    @register(Dispatch.DP_COMPUTE)
    def score(self, data: DataProto, temperature: float = 1.0) -> DataProto:
        return self._ready().score(data, temperature=temperature)

    @register(Dispatch.ONE_TO_ALL)
    def update_adapters(self, tensors: dict[str, Any], version: int) -> dict[str, float]:
        """Install adapters: name -> PEFT-format tensors, or what train workers export (``PackedTensors``
        from Ray's object store, ``SharedTensors`` files on this node), handed on as they are."""
        start = time.perf_counter()
        timings = self._ready().update_adapters(tensors, version)
        served = getattr(self.strategy, "adapters_served", None)
        self._last_sync = {"worker_s": time.perf_counter() - start,
                           **(getattr(served, "last_install", None) or {})}
        return timings

    @register(Dispatch.RANK_ZERO)
    def last_sync_profile(self) -> dict[str, float]:
        """Where rank 0's last install spent its time (seconds): ``worker_s`` (all of it in this worker)
        and, with vLLM's in-memory sync, ``rpc_s`` (the call into vLLM's worker, its installs included)."""
        return dict(self._last_sync)

    @register(Dispatch.ONE_TO_ALL)
    def record_generate_calls(self, on: bool = True) -> None:
        """Benchmarks (vllm): record this rank's generate calls for ``replay_generate_calls``."""
        self._recorder().record_generate_calls(on)

    @register(Dispatch.RANK_ZERO)
    def replay_generate_calls(self) -> dict[str, float]:
        """Benchmarks (vllm): rank 0's recorded calls replayed bare on its engine (``engine_replay``)."""
        return self._recorder().replay_generate_calls()

    @register(Dispatch.ONE_TO_ALL)
    def adapter_versions(self) -> dict[str, int]:
        """adapter -> the version this rank's engine serves (through a Cluster: one dict per rank, so a
        sync that missed any engine shows)."""
        return self._ready().adapter_versions()

    @register(Dispatch.ONE_TO_ALL)
    def sleep(self, level: SleepLevel = 1) -> None:
        self._ready().sleep(level)

    @register(Dispatch.ONE_TO_ALL)
    def wake_up(self) -> None:
        self._ready().wake_up()

    @register(Dispatch.ONE_TO_ALL)
    def shutdown_engine(self) -> None:
        if self.strategy is not None:
            self.strategy.shutdown()
            self.strategy = None

    def close(self) -> None:
        self.shutdown_engine()  # vLLM: its engine process and the adapter folder in /dev/shm

    def _ready(self) -> InferBackend:
        if self.strategy is None:
            raise RuntimeError(f"{self.role} rank {self.rank}: call init_model() first")
        return self.strategy

    def _recorder(self) -> Any:
        """The engine, if it can record and replay its generate calls (benchmarks; only vllm can)."""
        engine = self._ready()
        if not hasattr(engine, "replay_generate_calls"):
            raise RuntimeError(
                f"rollout.backend={self.rollout_cfg.backend} does not record generate calls; use vllm"
            )
        return engine
