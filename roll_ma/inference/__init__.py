"""Inference backends: the engines that generate every agent's turns, chosen by ``rollout.backend``.

hf: transformers + PEFT, one model holding every agent's adapter.
vllm: one vLLM engine serving every agent's adapter at once.
A user's backend: a class implementing ``InferBackend``, named as 'pkg.module:Name' or 'path/file.py:Name'.
Imported lazily, so that `import roll_ma` needs no vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from roll_ma.registry import Registry, implements

if TYPE_CHECKING:
    from roll_ma.inference.infer_backend import RolloutTraits


# rollout.backend (and teacher.rollout.backend): a built-in name, 'pkg.module:Name' or 'path/file.py:Name';
# what a run asks of the backend beyond its methods is its class's traits, never its name
INFER_STRATEGIES: Registry[Any] = Registry(
    "rollout backend",
    "rollout.backend",
    "roll_ma.inference.INFER_STRATEGIES.register",
    builtins={
        "hf": "roll_ma.inference.hf_infer:HFInferStrategy",
        "vllm": "roll_ma.inference.vllm_infer:VLLMInferStrategy",
    },
    check=implements("roll_ma.inference.infer_backend:InferBackend"),
)


def infer_strategy_class(name: str) -> Any:
    """The class of the inference backend ``name`` (any spelling); a ValueError lists the known ones."""
    return INFER_STRATEGIES.get(name)


def rollout_traits(name: str) -> RolloutTraits:
    """What the backend ``name`` tells the checks and the driver (``RolloutTraits``); ValueError as
    ``infer_strategy_class``."""
    from roll_ma.inference.infer_backend import rollout_traits_of

    return rollout_traits_of(INFER_STRATEGIES.get(name))
