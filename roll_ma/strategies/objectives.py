"""What a train step optimises, chosen by name: ppo (the RL loop), sft, dpo.

A batch names its objective in ``meta_info["objective"]`` (default ppo). The train strategy
partitions the rows by agent exactly as for PPO and hands each policy's rows to the objective's
``update``, which drives that policy's own DeepSpeed engine (``PolicyUpdater``): an update of
agent k touches nothing of agent j, whatever the objective.

Supervised objectives share ``supervised_update`` (``strategies/supervised_update.py``): mini-batches
of ``train.mini_batch_size`` rows (default: all of them, one optimizer step), each split into this
rank's micro-batches by the same planner as PPO, the loss of every micro-batch divided by the
mini-batch's global count (tokens for SFT, pairs for DPO), one optimizer step per mini-batch. The
driver shuffles and batches the data.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from roll_ma.config.schema import AlgorithmConfig
from roll_ma.protocol import DataProto
from roll_ma.strategies.objective_dpo import DPOObjective
from roll_ma.strategies.objective_sft import SFTObjective
from roll_ma.strategies.policy_updater import TRAIN_KEYS, PolicyUpdate, PolicyUpdater
from roll_ma.strategies.scoring import check_columns


class Objective(Protocol):
    """One way to update a policy from its agents' rows."""

    name: str

    def check(self, data: DataProto, algo_cfg: AlgorithmConfig) -> None:
        """Raise ValueError naming what the batch lacks."""

    def row_tokens(self, data: DataProto) -> np.ndarray:
        """(B,) tokens each row trains on (for the per-agent ``tokens`` metric)."""

    def update(
        self,
        updater: PolicyUpdater,
        rows: DataProto,
        agent_of_row: np.ndarray,
        agent_ids: list[int],
        step: int,
        temperature: float,
    ) -> PolicyUpdate:
        """Update ``updater``'s policy from ``rows`` (every row belongs to one of ``agent_ids``)."""


class PPOObjective:
    """The RL loop's clipped policy gradient (``PolicyUpdater.update``)."""

    name = "ppo"

    def check(self, data: DataProto, algo_cfg: AlgorithmConfig) -> None:
        check_columns(data, TRAIN_KEYS, "train_step")
        kl_in_loss = algo_cfg.kl_coef > 0 and algo_cfg.kl_mode == "loss"
        if kl_in_loss and "ref_log_probs" not in data.batch.keys():
            raise ValueError(
                "algorithm.kl_coef > 0 with kl_mode=loss needs ref_log_probs in the batch; "
                "compute them with the reference (compute_ref_log_probs) before train_step"
            )

    def row_tokens(self, data: DataProto) -> np.ndarray:
        return data.batch["response_mask"].float().sum(-1).numpy()

    def update(
        self,
        updater: PolicyUpdater,
        rows: DataProto,
        agent_of_row: np.ndarray,
        agent_ids: list[int],
        step: int,
        temperature: float,
    ) -> PolicyUpdate:
        return updater.update(rows, agent_of_row, agent_ids, step, temperature)


def _objectives() -> dict[str, Any]:
    return {"ppo": PPOObjective(), "sft": SFTObjective(), "dpo": DPOObjective()}


def objective_named(name: str) -> Objective:
    """The objective registered under ``name`` (ppo, sft, dpo)."""
    table = _objectives()
    if name not in table:
        raise ValueError(f"unknown train objective {name!r}; known: {sorted(table)}")
    return table[name]
