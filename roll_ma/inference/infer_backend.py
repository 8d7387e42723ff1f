"""What a rollout worker asks of its inference backend: the plug point ``rollout.backend`` names.

``hf`` and ``vllm`` implement it; a new backend is a class with these methods, registered in
``INFER_STRATEGIES`` (``inference/__init__.py``). mypy checks the worker's calls against this.
"""

from __future__ import annotations

from typing import Any, Protocol

from roll_ma.protocol import DataProto


class InferBackend(Protocol):
    def initialize(self, initial_adapters: bool = True) -> None:
        """Load the model (and the adapters as they start, unless the run's first sync brings them)."""
        ...

    def generate(self, data: DataProto) -> DataProto:
        """Every row's response with its agent's adapter (the standard rollout keys)."""
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

    def sleep(self, level: int = 1) -> None: ...

    def wake_up(self) -> None: ...

    def shutdown(self) -> None: ...
