"""Supervised and preference losses as small pure functions returning (loss, detached stats).

Token tensors are (B, R) over response tokens with a (B, R) ``mask`` (1 = counts); sequence
tensors are (B,). ``denominator`` lets a caller that splits a mini-batch into micro-batches (and
ranks) normalise each piece by the whole mini-batch's count, so the summed gradients equal the
gradient of the mini-batch (see ``roll_ma.algorithms.losses``).

- ``sft_loss``: the negative log-likelihood of the response tokens, every response token of the
  mini-batch weighing the same (TRL's SFTTrainer with a completion-only loss; the prompt never
  counts).
- ``dpo_loss``: Direct Preference Optimization (Rafailov et al. 2023, eq. 7) with the sigmoid loss
  and optional label smoothing (conservative DPO, Mitchell 2023, eq. 3), as TRL's DPOTrainer
  ``loss_type="sigmoid"``. Sequence log-probs are sums over response tokens (``sequence_log_probs``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sequence_log_probs(token_log_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B,) log pi(response | prompt): the sum of the (B, R) token log-probs where ``mask`` is 1."""
    return (token_log_probs * mask.to(token_log_probs.dtype)).sum(-1)


def sft_loss(
    log_probs: torch.Tensor, mask: torch.Tensor, denominator: float | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """Token NLL of the responses: L = -sum(mask * log pi) / N, N = response tokens (or ``denominator``).

    Stats: ``nll_sum`` (the summed NLL of these tokens) and ``tokens``, so a caller can average
    over micro-batches, agents and ranks exactly.
    """
    m = mask.to(log_probs.dtype)
    nll_sum = -(log_probs * m).sum()
    denom = denominator if denominator is not None else m.sum().clamp(min=1.0)
    return nll_sum / denom, {"nll_sum": float(nll_sum.detach()), "tokens": float(m.sum())}


def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    beta: float,
    label_smoothing: float = 0.0,
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPO sigmoid loss over B pairs (all arguments (B,) sequence log-probs).

    h = (log pi(y_w) - log pi(y_l)) - (log pi_ref(y_w) - log pi_ref(y_l))
    l = -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h)        (eps = label_smoothing)
    L = sum(l) / B (or / ``denominator``)

    Stats, detached and per pair (B,), named as TRL logs their means: ``loss``, ``rewards/chosen``
    = beta (log pi(y_w) - log pi_ref(y_w)), ``rewards/rejected`` likewise for y_l,
    ``rewards/margins`` = chosen - rejected, ``rewards/accuracies`` = 1 where chosen > rejected,
    ``logps/chosen``, ``logps/rejected``.
    """
    if beta <= 0:
        raise ValueError(f"dpo beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"dpo label_smoothing must be in [0, 0.5), got {label_smoothing}")
    logits = (chosen_logps - rejected_logps) - (ref_chosen_logps - ref_rejected_logps)  # (B,)
    losses = (
        -F.logsigmoid(beta * logits) * (1.0 - label_smoothing)
        - F.logsigmoid(-beta * logits) * label_smoothing
    )  # (B,)
    denom = denominator if denominator is not None else max(losses.shape[0], 1)
    loss = losses.sum() / denom
    with torch.no_grad():
        chosen_rewards = beta * (chosen_logps - ref_chosen_logps)
        rejected_rewards = beta * (rejected_logps - ref_rejected_logps)
        stats = {
            "loss": losses.detach(),
            "rewards/chosen": chosen_rewards.detach(),
            "rewards/rejected": rejected_rewards.detach(),
            "rewards/margins": (chosen_rewards - rejected_rewards).detach(),
            "rewards/accuracies": (chosen_rewards > rejected_rewards).to(losses.dtype),
            "logps/chosen": chosen_logps.detach(),
            "logps/rejected": rejected_logps.detach(),
        }
    return loss, stats
