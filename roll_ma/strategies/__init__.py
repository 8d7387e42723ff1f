"""Backends chosen by name and imported lazily, so `import roll_ma` needs no vLLM or DeepSpeed.

train: multi_agent_deepspeed (one adapter per agent), deepspeed_train (one policy)
infer: hf (transformers + PEFT), vllm (one engine serving every adapter)
"""

from __future__ import annotations

import importlib
from typing import Any

TRAIN_STRATEGIES = {
    "multi_agent_deepspeed": "roll_ma.strategies.multi_agent_deepspeed:MultiAgentDeepSpeedStrategy",
    "deepspeed_train": "roll_ma.strategies.deepspeed_train:DeepSpeedTrainStrategy",
}
INFER_STRATEGIES = {
    "hf": "roll_ma.strategies.hf_infer:HFInferStrategy",
    "vllm": "roll_ma.strategies.vllm_infer:VLLMInferStrategy",
}


def _load(table: dict[str, str], name: str, kind: str) -> Any:
    if name not in table:
        raise ValueError(f"unknown {kind} strategy {name!r}; known: {sorted(table)}")
    module, cls = table[name].split(":")
    return getattr(importlib.import_module(module), cls)


def train_strategy_class(name: str) -> Any:
    return _load(TRAIN_STRATEGIES, name, "train")


def infer_strategy_class(name: str) -> Any:
    return _load(INFER_STRATEGIES, name, "rollout")
