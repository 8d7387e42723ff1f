"""ReferenceWorker: the base model alone (no adapters), scoring reference log-probs.

Used with ``reference.mode=worker`` (and required by full fine-tuning, whose base weights
move). It runs the same scoring code as the train worker's adapters-disabled path, so both
reference sources give the same numbers.
"""

from __future__ import annotations

from typing import Any

import torch

from roll_ma.distributed.worker import Dispatch, Worker, register
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import ScoreRequest
from roll_ma.workers.worker_specs import ReferenceWorkerSpec


class ReferenceWorker(Worker):
    """Holds only the frozen base weights; ``compute_ref_log_probs`` adds ``ref_log_probs`` (B, R). Built
    from one ``ReferenceWorkerSpec`` (``spec``: the model, the scoring batching), nothing else."""

    def __init__(self, role: str, rank: int = 0, world_size: int = 1, env_vars: dict[str, str] | None = None,
                 *, spec: ReferenceWorkerSpec):
        if not isinstance(spec, ReferenceWorkerSpec):  # a dict of settings: ReferenceWorkerSpec.from_settings
            raise TypeError(f"a reference worker is built from a ReferenceWorkerSpec, got "
                            f"{type(spec).__name__}")
        super().__init__(role, rank, world_size, env_vars)
        self.spec = spec
        self.model: Any = None
        self.device = torch.device("cpu")

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        from roll_ma.models.loading import load_base_model
        from roll_ma.training.ds_utils import training_device, use_cpu_threads

        if not torch.cuda.is_available():
            use_cpu_threads(self.world_size)  # oversubscribed threads slow every worker on the machine down
        self.device = training_device()
        self.model = load_base_model(self.spec.model, str(self.device), packed_rows=True)  # eval mode
        for p in self.model.parameters():
            p.requires_grad_(False)

    @register(Dispatch.DP_BALANCED)
    def compute_ref_log_probs(self, data: DataProto, request: ScoreRequest) -> DataProto:
        """``ref_log_probs`` (B, R) float32 from the base at the request's temperature, in micro-batches."""
        from roll_ma.training.scoring import score_rows

        if self.model is None:
            raise RuntimeError(f"{self.role} rank {self.rank}: call init_model() first")
        log_probs, _ = score_rows(self.model, data, self.spec.batching, self.device, request.temperature)
        return DataProto.from_dict({"ref_log_probs": log_probs}, meta_info=data.meta_info)
