"""What a train step optimises, chosen by name: ppo (the RL loop), sft, dpo.

A batch names its objective in ``meta_info["objective"]`` (default ppo). The train strategy
partitions the rows by agent exactly as for PPO and hands each policy's rows to the objective's
``update``, which drives that policy's own DeepSpeed engine (``PolicyUpdater``): an update of
agent k touches nothing of agent j, whatever the objective.

Supervised objectives share ``supervised_update``: mini-batches of ``train.mini_batch_size`` rows
(default: all of them, one optimizer step), each split into this rank's micro-batches by the same
planner as PPO, the loss of every micro-batch divided by the mini-batch's global count (tokens for
SFT, pairs for DPO), one optimizer step per mini-batch. The driver shuffles and batches the data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import torch

from roll_ma.config.schema import AlgorithmConfig
from roll_ma.protocol import DataProto
from roll_ma.strategies.ds_utils import all_reduce_sum
from roll_ma.strategies.policy_updater import TRAIN_KEYS, PolicyUpdate, PolicyUpdater
from roll_ma.strategies.scoring import check_columns

# micro_loss(idx, real, local_denoms) -> (loss, (num_slots, K) float64 per-agent sums); local_denoms: (C,)
MicroLoss = Callable[[torch.Tensor, torch.Tensor, np.ndarray], tuple[torch.Tensor, torch.Tensor]]


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


def row_slots(agent_of_row: np.ndarray, agent_ids: list[int]) -> torch.Tensor:
    """(N,) the position of each row's agent in ``agent_ids`` (its slot in the per-agent sums)."""
    slot_of = {a: s for s, a in enumerate(agent_ids)}
    return torch.tensor([slot_of[int(a)] for a in agent_of_row], dtype=torch.long)


def supervised_update(
    updater: PolicyUpdater,
    n: int,
    prompt_lens: np.ndarray,
    response_lens: np.ndarray,
    counts: np.ndarray,
    micro_loss: MicroLoss,
    num_slots: int,
    num_sums: int,
) -> tuple[PolicyUpdate, torch.Tensor]:
    """Mini-batches x micro-batches over ``n`` rows; returns the update's facts and the (num_slots, num_sums)
    per-agent sums, all-reduced over ranks.

    counts: (n,) or (n, C): what each row adds to the loss's denominator(s) (its response tokens, 1 per
        pair, ...); ``micro_loss`` gets each column's mini-batch sum divided by the world size, and a
        mini-batch whose first column sums to 0 is skipped.
    prompt_lens, response_lens: (n,) what the micro-batch planner counts for each row.
    """
    mini = min(updater.train_cfg.mini_batch_size or n, n)
    sums = torch.zeros(num_slots, num_sums, dtype=torch.float64)
    norms: list[float] = []
    nonfinite = 0
    lr = updater.current_lr
    updater.activate()
    updater.engine.train()
    for start in range(0, n, mini):
        batch_idx = np.arange(start, min(n, start + mini))
        denoms = counts.reshape(n, -1)[batch_idx].sum(0)  # (C,)
        if denoms[0] == 0:
            continue  # nothing to learn; an Adam step on zero gradients would still move by momentum
        local_denom = denoms / updater.world_size  # DeepSpeed averages the ranks' gradients
        micro = updater.batching.rank_plan(
            batch_idx, prompt_lens, response_lens, updater.rank, updater.world_size
        )

        def loss_of(
            idx: torch.Tensor, real: torch.Tensor, local_denom: np.ndarray = local_denom
        ) -> torch.Tensor:
            nonlocal sums
            loss, micro_sums = micro_loss(idx, real, local_denom)
            sums += micro_sums
            return loss

        lr = updater.current_lr
        norm, stepped = updater.step_micro_batches(micro, batch_idx, loss_of)
        nonfinite += int(not stepped)
        norms.append(norm)
    sums = all_reduce_sum(sums, updater.device)
    result = PolicyUpdate(
        optimizer_steps=len(norms) - nonfinite,
        grad_norm=float(np.mean(norms)) if norms else 0.0,
        lr=lr,
        skipped_nonfinite=nonfinite,
    )
    return result, sums


def _objectives() -> dict[str, Any]:
    from roll_ma.strategies.objective_dpo import DPOObjective
    from roll_ma.strategies.objective_sft import SFTObjective

    return {"ppo": PPOObjective(), "sft": SFTObjective(), "dpo": DPOObjective()}


def objective_named(name: str) -> Objective:
    """The objective registered under ``name`` (ppo, sft, dpo)."""
    table = _objectives()
    if name not in table:
        raise ValueError(f"unknown train objective {name!r}; known: {sorted(table)}")
    return table[name]
