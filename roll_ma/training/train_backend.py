"""What a train worker asks of its training backend: the plug point ``train.strategy`` names.

``multi_agent_deepspeed`` (and ``deepspeed_train``, one policy) implement it; a new backend is a class with
these methods, registered in ``TRAIN_STRATEGIES`` (``training/__init__.py``). mypy checks the worker's calls
against this, not against one implementation.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import PairReference, UpdateRequest


class TrainBackend(Protocol):
    model: Any  # the shared base with every adapter (the MFU profile reads its config)

    def initialize(self, total_steps: int | None = None) -> None:
        """Build the model, the adapters and one optimizer per policy; ``total_steps``: the lr horizon."""
        ...

    def compute_log_probs(self, data: DataProto, adapters_enabled: bool = True, temperature: float = 1.0,
                          with_entropy: bool = False) -> DataProto:
        """(B, R) response log-probs, each row with its agent's adapter (or none: the reference)."""
        ...

    def compute_values(self, data: DataProto) -> DataProto:
        """(B, R) the critic's values (``algorithm.advantage=gae``)."""
        ...

    def train_step(self, data: DataProto, request: UpdateRequest = ...) -> dict[str, float]:
        """Update every trainable policy on its own rows as ``request`` says; returns the step's metrics."""
        ...

    def compute_pair_ref_log_probs(self, data: DataProto, reference: PairReference = "copy") -> DataProto:
        """DPO: the reference log-probs of chosen and rejected responses."""
        ...

    def snapshot_reference(self) -> list[str]:
        """Copy the adapters as they are now into the reference copies; returns the policies copied."""
        ...

    def reset_optimizers(self, lr: float | None = None) -> None:
        """A fresh optimizer per policy (a new phase), at ``lr`` if given."""
        ...

    def score_choices(self, data: DataProto) -> DataProto:
        """Joint search: each row's choice probabilities under its agent's adapter."""
        ...

    def distill_choices(self, data: DataProto, max_steps: int, stop_prob: float) -> dict[str, float]:
        """Joint search: move each adapter towards the searched choices."""
        ...

    def adapter_tensors(self, adapters: list[str] | None = None, packed: bool = False,
                        dtype: str | None = None, shared: Any = None) -> dict[str, Any]:
        """The named adapters' weights for the rollout engines (default: all of them)."""
        ...

    def save_checkpoint(self, ckpt_dir: str | os.PathLike) -> None: ...

    def load_checkpoint(self, ckpt_dir: str | os.PathLike) -> None: ...
