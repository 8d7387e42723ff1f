"""Training backends: where each policy's weights, optimizer and update live, chosen by ``train.strategy``.

multi_agent_deepspeed: one LoRA adapter per agent on one shared base, updated agent after agent.
deepspeed_train: one policy (a shared adapter or full fine-tuning).
Imported lazily, so that `import roll_ma` needs no DeepSpeed.
"""

from __future__ import annotations

from typing import Any

from roll_ma.registry import Registry, is_class

# train.strategy's schema admits the built-in names only: the run's stages read them (deepspeed_train trains
# one policy); a backend of a user's would be a spec here, once the config lets it through
TRAIN_STRATEGIES: Registry[Any] = Registry(
    "train strategy",
    "train.strategy",
    "roll_ma.training.TRAIN_STRATEGIES.register",
    builtins={
        "multi_agent_deepspeed": "roll_ma.training.multi_agent_deepspeed:MultiAgentDeepSpeedStrategy",
        "deepspeed_train": "roll_ma.training.deepspeed_train:DeepSpeedTrainStrategy",
    },
    check=is_class,
)


def train_strategy_class(name: str) -> Any:
    """The class of the training backend ``name``; a ValueError lists the known ones."""
    return TRAIN_STRATEGIES.get(name)
