"""The loop both supervised objectives (sft, dpo) run over one policy's rows: mini-batches of
``train.mini_batch_size`` rows, each split into this rank's micro-batches by PPO's planner, one optimizer
step per mini-batch. ``objectives.py`` picks the objective; ``objective_sft.py`` and ``objective_dpo.py``
give the loss of a micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from roll_ma.strategies.ds_utils import all_reduce_sum
from roll_ma.strategies.policy_updater import PolicyUpdate, PolicyUpdater

# micro_loss(idx, real, local_denoms) -> (loss, (num_slots, K) float64 per-agent sums); local_denoms: (C,)
MicroLoss = Callable[[torch.Tensor, torch.Tensor, np.ndarray], tuple[torch.Tensor, torch.Tensor]]


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
