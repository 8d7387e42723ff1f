"""What a rollout worker asks of its inference backend: the plug point ``rollout.backend`` names.

``hf`` and ``vllm`` implement it; a new backend is a class with these methods, named in the config as
'pkg.module:Name' or 'path/to/file.py:Name' (or registered in ``INFER_STRATEGIES``,
``inference/__init__.py``).
mypy checks the worker's calls against this. What the checks before Ray and the driver need to know of a
backend (a package it needs, the dtypes it runs in, ...) is its class's ``traits``, never its name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol

from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import GenerateRequest

# what a colocated engine frees while the trainer works (rollout.sleep_level, 0 aside: no sleep at all)
SleepLevel = Literal[1, "kv_cache"]


class Generator(Protocol):
    """Whatever answers generate requests: a backend, the rollout workers (a ``Cluster``, whose
    ``generate`` is the workers'), or a stand-in that plays known answers (``workers/replay.py``).
    The env and workflow workers call only this, so mypy checks their requests."""

    def generate(self, data: DataProto, request: GenerateRequest) -> DataProto:
        """Every row's response with its agent's adapter (the standard rollout keys), sampled as
        ``request`` says (the rollout config's defaults where it says nothing)."""
        ...


class InferBackend(Generator, Protocol):
    def initialize(self, initial_adapters: bool = True) -> None:
        """Load the model (and the adapters as they start, unless the run's first sync brings them)."""
        ...

    def score(self, data: DataProto, temperature: float = 1.0) -> DataProto:
        """(B, R) log-probs of given responses under each row's adapter."""
        ...

    def update_adapters(self, tensors: dict[str, Any], version: int) -> dict[str, float]:
        """Serve these adapter weights as ``version`` from now on; returns timing metrics."""
        ...

    def adapter_versions(self) -> dict[str, int]:
        """The version of each adapter the engine serves now."""
        ...

    def sleep(self, level: SleepLevel = 1) -> None:
        """Free GPU memory while the trainer works (``rollout.sleep_level``: 1 or kv_cache)."""

    def wake_up(self) -> None: ...

    def shutdown(self) -> None: ...


@dataclass(frozen=True)
class RolloutTraits:
    """What a rollout backend class tells the checks before Ray and the driver (its ``traits`` attribute;
    a class without one has these defaults, which describe the hf backend).

    Args:
        needs_package: a module that must be importable where the run starts (checked before Ray).
        install_hint: how to install it (the message of a missing one).
        gpu_dtypes: the ``model.dtype`` values it runs in on GPU; None: any.
        tensor_parallel: one engine may span several GPUs (``rollout.tensor_parallel``).
        sleep_frees_gpu: its ``sleep`` gives a colocated trainer the GPU, so no rollout can overlap an
            update (``rollout.max_staleness``).
        serves_full_weights: it can serve fully fine-tuned weights (``train.full_finetune``), not only
            adapters.
        adapters_in_model_dtype: it serves adapters in the model's dtype, so the trainer exports them cast.
    """

    needs_package: str | None = None
    install_hint: str = ""
    gpu_dtypes: tuple[str, ...] | None = None
    tensor_parallel: bool = False
    sleep_frees_gpu: bool = False
    serves_full_weights: bool = True
    adapters_in_model_dtype: bool = False


def rollout_traits_of(cls: type) -> RolloutTraits:
    """The traits of a rollout backend class (the defaults when it declares none)."""
    traits = getattr(cls, "traits", None)
    return traits if isinstance(traits, RolloutTraits) else RolloutTraits()
