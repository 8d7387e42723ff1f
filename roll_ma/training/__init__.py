"""Training backends: where each policy's weights, optimizer and update live, chosen by ``train.strategy``.

multi_agent_deepspeed: one LoRA adapter per agent on one shared base, updated agent after agent.
deepspeed_train: one policy (a shared adapter or full fine-tuning).
A user's backend: a class implementing ``TrainBackend``, named as 'pkg.module:Name' or 'path/file.py:Name'.
Imported lazily, so that `import roll_ma` needs no DeepSpeed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from roll_ma.registry import Registry, implements

if TYPE_CHECKING:
    from roll_ma.training.train_backend import TrainTraits


# train.strategy: a built-in name, 'pkg.module:Name' or 'path/file.py:Name'; what a run asks of the backend
# beyond its methods is its class's traits (deepspeed_train trains one policy), never its name
TRAIN_STRATEGIES: Registry[Any] = Registry(
    "train strategy",
    "train.strategy",
    "roll_ma.training.TRAIN_STRATEGIES.register",
    builtins={
        "multi_agent_deepspeed": "roll_ma.training.multi_agent_deepspeed:MultiAgentDeepSpeedStrategy",
        "deepspeed_train": "roll_ma.training.deepspeed_train:DeepSpeedTrainStrategy",
    },
    check=implements("roll_ma.training.train_backend:TrainBackend"),
)


def train_strategy_class(name: str) -> Any:
    """The class of the training backend ``name`` (any spelling); a ValueError lists the known ones."""
    return TRAIN_STRATEGIES.get(name)


def train_traits(name: str) -> TrainTraits:
    """What the backend ``name`` tells the checks before Ray (``TrainTraits``); ValueError as
    ``train_strategy_class``."""
    from roll_ma.training.train_backend import train_traits_of

    return train_traits_of(TRAIN_STRATEGIES.get(name))
