"""Inference backends: the engines that generate every agent's turns, chosen by ``rollout.backend``.

hf: transformers + PEFT, one model holding every agent's adapter.
vllm: one vLLM engine serving every agent's adapter at once.
Imported lazily, so that `import roll_ma` needs no vLLM.
"""

from __future__ import annotations

from typing import Any

from roll_ma.registry import Registry, is_class

# rollout.backend's schema admits the built-in names only: the run's stages read them (vllm sleeps and syncs
# adapters in memory); a backend of a user's would be a spec here, once the config lets it through
INFER_STRATEGIES: Registry[Any] = Registry(
    "rollout backend",
    "rollout.backend",
    "roll_ma.inference.INFER_STRATEGIES.register",
    builtins={
        "hf": "roll_ma.inference.hf_infer:HFInferStrategy",
        "vllm": "roll_ma.inference.vllm_infer:VLLMInferStrategy",
    },
    check=is_class,
)


def infer_strategy_class(name: str) -> Any:
    """The class of the inference backend ``name``; a ValueError lists the known ones."""
    return INFER_STRATEGIES.get(name)
