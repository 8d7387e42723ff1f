"""What a train step optimises, chosen by name: ppo (the RL loop), sft, dpo.

A train step names its objective in ``UpdateRequest.objective`` (default ppo). The train strategy
partitions the rows by agent exactly as for PPO and hands each policy's rows to the objective's
``update``, which runs ``update_loop.run_update`` on that policy's own DeepSpeed engine
(``PolicyEngine``) with its micro-batch loss: an update of agent k touches nothing of agent j,
whatever the objective. The critic's value loss (``objective_value.py``) runs through the same loop.
"""

from __future__ import annotations

from roll_ma.training.objective_dpo import DPOObjective
from roll_ma.training.objective_ppo import PPOObjective
from roll_ma.training.objective_sft import SFTObjective
from roll_ma.training.update_loop import TrainObjective


def objective_named(name: str) -> TrainObjective:
    """The train objective called ``name`` (ppo, sft, dpo)."""
    table: dict[str, TrainObjective] = {"ppo": PPOObjective(), "sft": SFTObjective(), "dpo": DPOObjective()}
    if name not in table:
        raise ValueError(f"unknown train objective {name!r}; known: {sorted(table)}")
    return table[name]
