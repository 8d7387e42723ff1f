"""Policy-gradient losses as small pure functions returning (loss, detached stats).

All tensors are (B, R) over response tokens with a (B, R) ``mask`` (1 = counts). The
aggregation is token-level by default: every real token of the batch weighs the same
(``token_mean``, as in DAPO / verl's default), or ``seq_mean``: average per sequence first.
``denominator`` lets a caller that splits a mini-batch into micro-batches normalise every
micro-batch by the mini-batch's token (or sequence) count, so the summed gradients equal
the gradient of the whole mini-batch.
"""

from __future__ import annotations

from typing import Any

import torch


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean", denominator: float | None = None
) -> torch.Tensor:
    """Masked mean of (B, R) ``values``: over all tokens, or per sequence then over sequences."""
    mask = mask.to(values.dtype)
    if mode == "token_mean":
        denom = denominator if denominator is not None else mask.sum().clamp(min=1.0)
        return (values * mask).sum() / denom
    if mode == "seq_mean":
        per_seq = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        denom = denominator if denominator is not None else max(values.shape[0], 1)
        return per_seq.sum() / denom
    raise ValueError(f"unknown loss aggregation {mode!r}; use token_mean or seq_mean")


def ppo_clip_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    agg: str = "token_mean",
    denominator: float | None = None,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7), negated for minimisation.

    L = -min(r A, clip(r, 1 - eps_low, 1 + eps_high) A), r = exp(log pi - log pi_old).
    ``weights`` (B, R), detached, multiply each token's term: the decoupled objective's importance
    weights (``behavior_weights``); None = 1.
    """
    log_ratio = (log_probs - old_log_probs).clamp(-20.0, 20.0)  # exp() of a stale row must not overflow
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if weights is not None:
        per_token = per_token * weights
    loss = aggregate(per_token, mask, agg, denominator)
    with torch.no_grad():
        m = mask.to(per_token.dtype)
        n = m.sum().clamp(min=1.0)
        stats = {
            "clip_frac": float(((clipped > unclipped).to(m.dtype) * m).sum() / n),
            "approx_kl": float((0.5 * log_ratio.pow(2) * m).sum() / n),
            "ratio_mean": float((ratio * m).sum() / n),
        }
    return loss, stats


def ppo_clip_policy_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
                         mask: torch.Tensor, algo: Any, denominator: float | None,
                         weights: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, float]]:
    """``algorithm.policy_loss: ppo_clip`` (the default): ``ppo_clip_loss`` with the config's clip ratios
    and aggregation."""
    return ppo_clip_loss(log_probs, old_log_probs, advantages, mask, algo.clip_ratio_low,
                         algo.clip_ratio_high, algo.loss_agg, denominator, weights)


def clipped_value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange: float = 0.2,
    agg: str = "token_mean",
    denominator: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped value loss (Schulman et al. 2017's baselines ppo2; verl ``compute_value_loss``).

    L = 0.5 * max((V - R)^2, (V_old + clip(V - V_old, -eps, eps) - R)^2), all (B, R); ``cliprange`` 0
    turns the clipping off. stats: value_clip_frac (tokens where the clipped term is the larger one).
    """
    unclipped = (values - returns).pow(2)
    if cliprange > 0:
        clipped_values = old_values + (values - old_values).clamp(-cliprange, cliprange)
        clipped = (clipped_values - returns).pow(2)
        per_token = 0.5 * torch.maximum(unclipped, clipped)
    else:
        clipped = unclipped
        per_token = 0.5 * unclipped
    loss = aggregate(per_token, mask, agg, denominator)
    with torch.no_grad():
        m = mask.to(per_token.dtype)
        n = m.sum().clamp(min=1.0)
        stats = {"value_clip_frac": float(((clipped > unclipped).to(m.dtype) * m).sum() / n)}
    return loss, stats


def behavior_weights(
    proximal_log_probs: torch.Tensor, behavior_log_probs: torch.Tensor, cap: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncated importance weights of decoupled PPO (Hilton et al. 2022; AReaL, Fu et al. 2025).

    Rows sampled by an older adapter (the behaviour policy, log-probs the engine reported) are trained
    with PPO's ratio and clip taken against the proximal policy (the trainer's adapter when the update
    starts, ``old_log_probs``) and each token weighted by w = min(pi_prox / pi_behav, cap):
    L = -w * min(r A, clip(r) A), r = pi / pi_prox. Returns (B, R) detached weights and the (B, R) mask of
    truncated ones; w = 1 exactly when the two log-probs are equal.
    """
    raw = torch.exp((proximal_log_probs - behavior_log_probs).clamp(-20.0, 20.0)).detach()
    return raw.clamp(max=cap), raw > cap


def kl_estimate(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman, "Approximating KL").

    k1 = log pi - log pi_ref (unbiased, can be negative);
    k3 = exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1 (unbiased, always >= 0).
    """
    if estimator == "k1":
        return log_probs - ref_log_probs
    if estimator == "k3":
        delta = (ref_log_probs - log_probs).clamp(-20.0, 20.0)
        return torch.exp(delta) - delta - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}; use k1 or k3")


def entropy_coef_at(coef: float, decay_steps: int, step: int) -> float:
    """The entropy bonus weight at ``step`` (1-based): ``coef`` decayed linearly to 0 at ``decay_steps``.

    ``decay_steps=0`` keeps it constant. Annealed, not constant: a constant bonus keeps the agents
    at the softened optimum; a decaying one explores early and then lets them commit.
    """
    if decay_steps <= 0:
        return coef
    return coef * max(0.0, 1.0 - (step - 1) / decay_steps)


def choice_entropy(choice_log_probs: torch.Tensor, choice_mask: torch.Tensor) -> torch.Tensor:
    """(B,) entropy of each row's distribution over its K choices, renormalised over the choices.

    choice_log_probs: (B, K) log pi(choice | prompt) of each legal action's whole answer;
    choice_mask: (B, K) 1 on a row's real choices (rows may have fewer than K). The
    renormalisation makes this the entropy of the action the policy picks among well-formed
    answers: raising it spreads mass over the actions, never onto malformed text.
    """
    mask = choice_mask.bool()
    # why a finite fill, not -inf: 0 * -inf is NaN, and its gradient would spread to the real choices
    logits = choice_log_probs.float().masked_fill(~mask, -1e9)
    log_q = torch.log_softmax(logits, dim=-1)  # (B, K)
    terms = torch.where(mask, log_q.exp() * log_q, torch.zeros_like(log_q))
    return -terms.sum(-1)  # a row without choices gets 0
