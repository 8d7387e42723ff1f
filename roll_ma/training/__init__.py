"""Training backends: where each policy's weights, optimizer and update live, chosen by ``train.strategy``.

multi_agent_deepspeed: one LoRA adapter per agent on one shared base, updated agent after agent.
deepspeed_train: one policy (a shared adapter or full fine-tuning).
Imported lazily, so that `import roll_ma` needs no DeepSpeed.
"""

from __future__ import annotations

import importlib
from typing import Any

TRAIN_STRATEGIES = {
    "multi_agent_deepspeed": "roll_ma.training.multi_agent_deepspeed:MultiAgentDeepSpeedStrategy",
    "deepspeed_train": "roll_ma.training.deepspeed_train:DeepSpeedTrainStrategy",
}


def train_strategy_class(name: str) -> Any:
    """The class of the training backend ``name``; a ValueError lists the known ones."""
    if name not in TRAIN_STRATEGIES:
        raise ValueError(f"unknown train strategy {name!r}; known: {sorted(TRAIN_STRATEGIES)}")
    module, cls = TRAIN_STRATEGIES[name].split(":")
    return getattr(importlib.import_module(module), cls)
