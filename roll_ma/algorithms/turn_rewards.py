"""Per-turn rewards as both advantage estimators see them: an agent's chain of turns in an episode, the
reward each turn trains on (its own, or the team's), the reward on the turn's last token, and the KL
penalty that ``kl_mode=reward`` adds. ``advantages.py`` (GRPO, REINFORCE++) and ``gae.py`` (PPO with a
value critic) both build on these; neither imports the other's estimator.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from roll_ma.algorithms.losses import kl_estimate


def turn_chains(episode_ids: Sequence[Any], players: Sequence[int], turns: Sequence[int]) -> list[list[int]]:
    """Row indices of each (episode, player)'s turns, in turn order: one agent's chain of an episode."""
    chains: dict[tuple[Any, int], list[int]] = defaultdict(list)
    for i, (ep, pl) in enumerate(zip(episode_ids, players)):
        chains[(ep, int(pl))].append(i)
    return [sorted(rows, key=lambda r: int(turns[r])) for rows in chains.values()]


def team_turn_rewards(
    scores: Sequence[float],
    episode_ids: Sequence[Any],
    players: Sequence[int],
    turns: Sequence[int],
    share: bool,
) -> np.ndarray:
    """(B,) the reward each turn trains on: its own (``share`` False) or, with ``share``, its own plus
    every other player's reward earned from this turn until this player's next turn.

    Example (Reasoner turn 0, Actor turn 1 rewarded 1.0): own -> [0, 1]; shared -> [1, 1].
    A reward earned before a player's first turn does not reach that player.
    """
    own = np.asarray(scores, dtype=np.float64)
    if not share:
        return own.copy()
    out = np.zeros_like(own)
    by_episode: dict[Any, list[int]] = defaultdict(list)
    for i, ep in enumerate(episode_ids):
        by_episode[ep].append(i)
    for rows in by_episode.values():
        rows = sorted(rows, key=lambda r: int(turns[r]))
        latest: dict[int, int] = {}  # player -> its latest row so far
        for j in rows:
            latest[int(players[j])] = j
            for i in latest.values():  # the reward of turn j reaches every player's latest turn up to j
                out[i] += own[j]
    return out


def place_on_last_token(values: np.ndarray | torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) turn rewards -> (B, R) token rewards, the reward sitting on the last response token."""
    mask = response_mask.float()
    out = torch.zeros_like(mask)
    lengths = mask.sum(-1).long()
    rows = torch.nonzero(lengths > 0).squeeze(-1)
    v = torch.as_tensor(np.asarray(values), dtype=torch.float32, device=mask.device)
    # last real token = index of the last 1 in the mask (responses are right-padded)
    last = mask.shape[1] - 1 - torch.flip(mask, dims=[1]).argmax(dim=1)
    out[rows, last[rows]] = v[rows]
    return out


def kl_reward_penalty(kl: torch.Tensor, response_mask: torch.Tensor, kl_coef: float) -> torch.Tensor:
    """(B, R) token rewards -kl_coef * KL(pi_old || pi_ref) per token (KL as a reward penalty)."""
    return -kl_coef * kl * response_mask


def kl_reward_tokens(data: Any, algo: Any) -> torch.Tensor | None:
    """(B, R) the per-token KL penalty that ``algo.kl_mode == "reward"`` adds to the rewards (from batch
    ``old_log_probs`` and ``ref_log_probs``), or None when the KL is not in the reward."""
    if not (algo.kl_coef > 0 and algo.kl_mode == "reward"):
        return None
    kl = kl_estimate(data.batch["old_log_probs"], data.batch["ref_log_probs"], algo.kl_estimator)
    return kl_reward_penalty(kl, data.batch["response_mask"], algo.kl_coef)
