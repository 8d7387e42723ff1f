"""The critic's clipped value loss as a ``MicroBatchLoss``: a peer of the policy objectives.

One critic's rows run through ``update_loop.run_update`` like a policy's: its own engine (adapter +
value head), ``critic.ppo_epochs`` epochs, the loss of every micro-batch divided by the mini-batch's
global token count, times ``critic.value_loss_coef``. Sums (one slot: the critic): the value loss,
clipped tokens, tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from roll_ma.algorithms.losses import clipped_value_loss
from roll_ma.training.agent_sums import AgentSums

CRITIC_KEYS = ("input_ids", "attention_mask", "responses", "response_mask", "values", "returns")


class ValueLoss:
    """The ``MicroBatchLoss`` of critic ``name`` over the batch's columns. counts: (N,) response tokens.

    Args:
        model: the ``ValueModel`` (shared backbone + value heads).
        name: the critic (its adapter and head).
        cols: the batch's ``CRITIC_KEYS`` columns.
        cliprange, coef: ``critic.cliprange_value``, ``critic.value_loss_coef``.
        device: where the micro-batches run.
    """

    sum_fields: tuple[str, ...] = ("value_loss", "clipped", "tokens")

    def __init__(
        self,
        model: Any,
        name: str,
        cols: dict[str, torch.Tensor],
        cliprange: float,
        coef: float,
        device: torch.device,
    ):
        self.model, self.name, self.cols = model, name, cols
        self.cliprange, self.coef, self.device = cliprange, coef, device
        self.counts = cols["response_mask"].float().sum(-1).numpy().astype(np.float64)  # (N,)

    def micro_loss(
        self, idx: torch.Tensor, real: torch.Tensor, local_denoms: np.ndarray, sums: AgentSums
    ) -> torch.Tensor:
        cols, dev = self.cols, self.device
        local_denom = float(local_denoms[0])
        mask = cols["response_mask"][idx].to(dev).float() * real.to(dev)[:, None]  # (b, R)
        values = self.model.values(
            self.name,
            cols["input_ids"][idx].to(dev),
            cols["attention_mask"][idx].to(dev),
            cols["responses"].shape[1],
        )  # (b, R)
        old = cols["values"][idx].to(dev).float()  # (b, R)
        returns = cols["returns"][idx].to(dev).float()  # (b, R)
        loss, stats = clipped_value_loss(
            values, old, returns, mask, self.cliprange, "token_mean", local_denom
        )
        toks = float(mask.sum())
        sums.add(
            0,
            {
                "value_loss": float(loss.detach()) * local_denom,
                "clipped": stats["value_clip_frac"] * toks,
                "tokens": toks,
            },
        )
        return self.coef * loss
