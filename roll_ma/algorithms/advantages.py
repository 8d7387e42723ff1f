"""Turn returns and advantages for multi-agent episodes.

Every row is one turn of one agent. Rewards arrive per turn (``scores``); an agent's return
at a turn is its reward there plus the discounted returns of its own later turns in the same
episode (MARS's turn-level credit). Advantages are then normalised per agent: within
(group, agent) for GRPO, over the agent's rows for REINFORCE++, so an agent with large
rewards never swamps another agent's signal.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from roll_ma.algorithms.algorithm_registry import ADVANTAGE_ESTIMATORS, CRITIC_ESTIMATOR
from roll_ma.algorithms.gae import add_gae_advantages
from roll_ma.algorithms.turn_rewards import (
    kl_reward_tokens,
    place_on_last_token,
    team_turn_rewards,
    turn_chains,
)


def discounted_turn_returns(
    rewards: Sequence[float] | np.ndarray,
    episode_ids: Sequence[Any],
    players: Sequence[int],
    turns: Sequence[int],
    gamma: float = 1.0,
) -> np.ndarray:
    """(B,) G_t = r_t + gamma * G_next over each (episode, player)'s own turns, latest turn first."""
    r = np.asarray(rewards, dtype=np.float64)
    returns = np.zeros_like(r)
    for rows in turn_chains(episode_ids, players, turns):
        running = 0.0
        for i in reversed(rows):
            running = r[i] + gamma * running
            returns[i] = running
    return returns


def _normalise(values: np.ndarray, norm_std: bool, eps: float) -> np.ndarray:
    """Subtract the mean; divide by the std when asked. One value (or all equal) -> zeros, never NaN."""
    if len(values) <= 1:
        return np.zeros_like(values)
    centred = values - values.mean()
    if not norm_std:
        return centred
    std = values.std(ddof=0)  # population std: a 2-sample group still has a defined scale
    return centred / (std + eps) if std > 0 else np.zeros_like(values)


def grpo_advantages(
    returns: Sequence[float] | np.ndarray,
    group_ids: Sequence[Any],
    agent_ids: Sequence[int],
    norm_std: bool = True,
    eps: float = 1e-6,
) -> np.ndarray:
    """(B,) returns normalised within each (group, agent): GRPO's group baseline, one per agent."""
    values = np.asarray(returns, dtype=np.float64)
    adv = np.zeros_like(values)
    buckets: dict[tuple[Any, int], list[int]] = defaultdict(list)
    for i, (g, a) in enumerate(zip(group_ids, agent_ids)):
        buckets[(g, int(a))].append(i)
    for rows in buckets.values():
        adv[rows] = _normalise(values[rows], norm_std, eps)
    return adv


def reinforce_pp_advantages(
    returns: Sequence[float] | np.ndarray,
    agent_ids: Sequence[int],
    norm_std: bool = True,
    eps: float = 1e-6,
) -> np.ndarray:
    """(B,) REINFORCE++: the agent's batch mean as baseline, normalised over that agent's rows."""
    values = np.asarray(returns, dtype=np.float64)
    adv = np.zeros_like(values)
    per_agent: dict[int, list[int]] = defaultdict(list)
    for i, a in enumerate(agent_ids):
        per_agent[int(a)].append(i)
    for rows in per_agent.values():
        adv[rows] = _normalise(values[rows], norm_std, eps)
    return adv


def grpo_estimator(returns: np.ndarray, rows: Mapping[str, Any], algo: Any) -> np.ndarray:
    """``algorithm.advantage: grpo``: ``grpo_advantages`` over the rows' groups and agents."""
    return grpo_advantages(returns, rows["group_id"], rows["agent_id"], algo.norm_std)


def reinforce_pp_estimator(returns: np.ndarray, rows: Mapping[str, Any], algo: Any) -> np.ndarray:
    """``algorithm.advantage: reinforce_pp``: ``reinforce_pp_advantages`` over the rows' agents."""
    return reinforce_pp_advantages(returns, rows["agent_id"], algo.norm_std)


def broadcast_to_tokens(values: np.ndarray | torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B,) per-turn values -> (B, R) on the response tokens (0 on padding)."""
    v = torch.as_tensor(np.asarray(values), dtype=torch.float32, device=response_mask.device)
    return v.unsqueeze(-1) * response_mask.float()


def reverse_cumsum(token_values: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B, R) sum of the values at this token and after it (undiscounted return-to-go), masked."""
    masked = token_values * response_mask
    return torch.flip(torch.cumsum(torch.flip(masked, dims=[1]), dim=1), dims=[1]) * response_mask


# (B,) a weight of each row's advantage, from the rows' non-tensor columns: a study's (``roll_ma/studies``:
# the reward-class balance of ``study.balance_reward_classes``), which the RL step hands in
RowWeights = Callable[[Mapping[str, Any]], np.ndarray]


def add_advantages(data: Any, algo: Any, row_weights: RowWeights | None = None) -> Any:
    """Turn rewards -> per-agent advantages on a DataProto of turns (adds advantages, returns, token_rewards,
    trained_rewards). ``algo.advantage`` names a registered estimator (``algorithms/algorithm_registry.py``);
    "gae" goes to ``algorithms/gae.py`` (needs the critic's values).

    Needs batch ``scores`` and ``response_mask`` and non_tensor episode_id, player, turn, agent_id,
    group_id. With ``algo.kl_mode == "reward"`` it also needs ``old_log_probs`` and
    ``ref_log_probs``: the per-token KL penalty is added to the rewards and its return-to-go to
    the advantages. ``row_weights``: a study's weight of each row's advantage (``RowWeights``).
    """
    from roll_ma.protocol import DataProto

    if algo.advantage == CRITIC_ESTIMATOR:  # PPO with a value critic: token-level GAE (algorithms/gae.py)
        return add_gae_advantages(data, algo)
    estimator = ADVANTAGE_ESTIMATORS.get(algo.advantage)  # an unknown name fails before any work
    nt, mask = data.non_tensor, data.batch["response_mask"]
    trained = team_turn_rewards(data.batch["scores"].tolist(), nt["episode_id"], nt["player"], nt["turn"],
                                algo.share_reward_in_agent)  # (B,)
    returns = discounted_turn_returns(trained, nt["episode_id"], nt["player"], nt["turn"], algo.gamma)
    adv = np.asarray(estimator(returns, nt, algo), dtype=np.float64)  # (B,)
    if row_weights is not None:
        adv = adv * row_weights(nt)
    token_rewards = place_on_last_token(trained, mask)  # (B, R)
    advantages = broadcast_to_tokens(adv, mask)  # (B, R)
    penalty = kl_reward_tokens(data, algo)  # (B, R) or None
    if penalty is not None:
        token_rewards = token_rewards + penalty
        advantages = advantages + reverse_cumsum(penalty, mask)
    return data.union(
        DataProto.from_dict(
            {
                "advantages": advantages,
                "returns": broadcast_to_tokens(returns, mask),
                "token_rewards": token_rewards,
                "trained_rewards": torch.as_tensor(trained, dtype=torch.float32),  # (B,) after team sharing
            }
        )
    )
