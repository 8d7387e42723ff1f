"""What a train worker asks of its training backend: the plug point ``train.strategy`` names.

``TrainBackend`` is the core every run needs: build, score log-probs (and the critic's values), the
RL update, the adapters' weights for the rollout engines, checkpoints. What only some runs need is an
optional capability, a small Protocol of its own that a backend may also implement:

- ``PhaseCapable``: a fresh optimizer per training phase (``phases``: SFT, DPO);
- ``DPOCapable``: DPO's reference log-probs of chosen/rejected pairs and the frozen reference copies.

A study's pass over the policies (``roll_ma/studies``: the joint search) is no capability of the backend:
the study's function comes with the call (``TrainWorker.score_with`` / ``train_with``) and checks the
backend it is given.

``multi_agent_deepspeed`` (and ``deepspeed_train``, one policy) implement all of them; a new backend is a
class with the core methods (plus any capability it offers), named in the config as 'pkg.module:Name' or
'path/to/file.py:Name' (or registered in ``TRAIN_STRATEGIES``, ``training/__init__.py``); what the checks
before Ray need to know of it is its class's ``traits`` (``TrainTraits``), never its name. mypy checks
each backend against every Protocol it claims (the ``TYPE_CHECKING`` block under the class); the train
worker checks a capability where it is used (``isinstance``), so a config that needs one the backend lacks
fails naming it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import PairReference, UpdateRequest, UpdateResult


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

    def train_step(self, data: DataProto, request: UpdateRequest = ...) -> UpdateResult:
        """Update every trainable policy on its own rows as ``request`` says; returns what it updated and
        the step's metrics."""
        ...

    def adapter_tensors(self, adapters: list[str] | None = None, packed: bool = False,
                        dtype: str | None = None, shared: Any = None) -> dict[str, Any]:
        """The named adapters' weights for the rollout engines (default: all of them)."""
        ...

    def save_checkpoint(self, ckpt_dir: str | os.PathLike) -> None: ...

    def load_checkpoint(self, ckpt_dir: str | os.PathLike) -> None: ...


@runtime_checkable
class PhaseCapable(Protocol):
    """Training phases (``phases``: SFT, DPO) start each with a fresh optimizer."""

    def reset_optimizers(self, lr: float | None = None) -> None:
        """A fresh optimizer per policy (a new phase), at ``lr`` if given."""
        ...


@runtime_checkable
class DPOCapable(Protocol):
    """DPO phases: the reference log-probs of each pair, from frozen copies of the adapters (or the base)."""

    def compute_pair_ref_log_probs(self, data: DataProto, reference: PairReference = "copy") -> DataProto:
        """DPO: the reference log-probs of chosen and rejected responses."""
        ...

    def snapshot_reference(self) -> list[str]:
        """Copy the adapters as they are now into the reference copies; returns the policies copied."""
        ...


@dataclass(frozen=True)
class TrainTraits:
    """What a train backend class tells the checks before Ray (its ``traits`` attribute; a class without one
    has these defaults, which describe multi_agent_deepspeed).

    Args:
        trains_one_policy: every trainable agent must share one adapter (or the base, fully fine-tuned).
        supports_full_finetune: it can train every base weight (``train.full_finetune``).
    """

    trains_one_policy: bool = False
    supports_full_finetune: bool = False


def train_traits_of(cls: type) -> TrainTraits:
    """The traits of a train backend class (the defaults when it declares none)."""
    traits = getattr(cls, "traits", None)
    return traits if isinstance(traits, TrainTraits) else TrainTraits()


def missing_capability(strategy: str, capability: str, methods: str, needed_by: str) -> ValueError:
    """The error of a config that needs a capability ``train.strategy`` does not implement."""
    return ValueError(
        f"{needed_by} needs a train backend with the {capability} capability ({methods}), and "
        f"train.strategy={strategy} has none; pick a train.strategy that implements {capability} "
        f"(roll_ma/training/train_backend.py)"
    )
