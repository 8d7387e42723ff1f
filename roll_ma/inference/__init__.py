"""Inference backends: the engines that generate every agent's turns, chosen by ``rollout.backend``.

hf: transformers + PEFT, one model holding every agent's adapter.
vllm: one vLLM engine serving every agent's adapter at once.
Imported lazily, so that `import roll_ma` needs no vLLM.
"""

from __future__ import annotations

import importlib
from typing import Any

INFER_STRATEGIES = {
    "hf": "roll_ma.inference.hf_infer:HFInferStrategy",
    "vllm": "roll_ma.inference.vllm_infer:VLLMInferStrategy",
}


def infer_strategy_class(name: str) -> Any:
    """The class of the inference backend ``name``; a ValueError lists the known ones."""
    if name not in INFER_STRATEGIES:
        raise ValueError(f"unknown rollout strategy {name!r}; known: {sorted(INFER_STRATEGIES)}")
    module, cls = INFER_STRATEGIES[name].split(":")
    return getattr(importlib.import_module(module), cls)
