"""GAE over an agent's turns of an episode, for PPO with a value critic (MARFT, verl's ``gae``).

Each row is one turn of one agent (player). An agent's turns of one episode form one chain of
response tokens, in turn order; the turn's reward sits on its last token, the critic's value
V(s_t) on every token (the value of the prefix before token t). Within the chain:

    delta_t = r_t + gamma * V_{t+1} - V_t          (V after the chain's last token = 0)
    A_t     = delta_t + gamma * lam * A_{t+1}      (Schulman et al. 2016, eq. 16)
    R_t     = A_t + V_t                            (the critic's target)

so an agent's early turn is credited with what its later turns earned. Team reward
(``share_reward_in_agent``): every reward of the episode also reaches each other agent's
latest turn at or before it, so a Reasoner gets the reward of the Actor that answered after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from roll_ma.algorithms.turn_rewards import (
    kl_reward_tokens,
    place_on_last_token,
    team_turn_rewards,
    turn_chains,
)


def gae_advantages(
    token_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    episode_ids: Sequence[Any],
    players: Sequence[int],
    turns: Sequence[int],
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, R) advantages and (B, R) returns (value targets), GAE over each (episode, player)'s tokens.

    token_rewards, values, response_mask: (B, R) on the response tokens (responses right-padded).
    """
    mask = response_mask.bool().cpu().numpy()  # (B, R)
    rewards = token_rewards.double().cpu().numpy()  # (B, R)
    vals = values.double().cpu().numpy() * mask  # (B, R)
    # each chain's real response tokens, in order, as one row of a (C, L) matrix padded with zeros
    # (a padded token has reward 0 and value 0, so it adds nothing to the chain's advantages)
    token_rows, token_cols = [], []  # per chain: (L_c,) row and column of each token
    for rows in turn_chains(episode_ids, players, turns):
        token_rows.append(np.concatenate([np.full(int(mask[r].sum()), r) for r in rows]))
        token_cols.append(np.concatenate([np.nonzero(mask[r])[0] for r in rows]))
    longest = max((len(t) for t in token_rows), default=0)
    chain_rewards = np.zeros((len(token_rows), longest + 1))  # (C, L + 1): the last column is V = 0
    chain_values = np.zeros((len(token_rows), longest + 1))
    for c, (r, col) in enumerate(zip(token_rows, token_cols)):
        chain_rewards[c, :len(r)], chain_values[c, :len(r)] = rewards[r, col], vals[r, col]
    deltas = chain_rewards[:, :-1] + gamma * chain_values[:, 1:] - chain_values[:, :-1]  # (C, L)
    chain_adv = np.zeros_like(deltas)  # (C, L)
    running = np.zeros(len(token_rows))  # (C,)
    for t in range(longest - 1, -1, -1):  # one vector step per token position, all chains at once
        running = deltas[:, t] + gamma * lam * running
        chain_adv[:, t] = running
    adv = np.zeros_like(rewards)
    for c, (r, col) in enumerate(zip(token_rows, token_cols)):
        adv[r, col] = chain_adv[c, :len(r)]
    advantages = torch.from_numpy(adv).float()
    returns = (advantages + torch.from_numpy(vals).float()) * response_mask.float().cpu()
    return advantages, returns


def whiten_per_agent(advantages: torch.Tensor, response_mask: torch.Tensor, agent_ids: Sequence[int],
                     eps: float = 1e-8) -> torch.Tensor:
    """(B, R) advantages with mean 0 and std 1 over each agent's response tokens (verl's masked_whiten,
    per agent so that one agent's scale never swamps another's)."""
    out = torch.zeros_like(advantages)
    ids = np.asarray([int(a) for a in agent_ids])
    mask = response_mask.bool()
    for a in np.unique(ids):
        rows = torch.from_numpy(ids == a)
        m = mask & rows[:, None]  # (B, R) this agent's tokens
        x = advantages[m]
        if x.numel() < 2:
            continue
        out[m] = (x - x.mean()) / torch.sqrt(x.var(unbiased=False) + eps)
    return out


def explained_variance(returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> float:
    """1 - Var(returns - values) / Var(returns) over the masked tokens: 1 = a perfect critic, 0 = no better
    than predicting the mean, < 0 = worse. NaN-free: 0.0 when the returns do not vary."""
    m = mask.bool()
    r, v = returns[m].double(), values[m].double()
    if r.numel() < 2:
        return 0.0
    var = float(r.var(unbiased=False))
    if var <= 0:
        return 0.0
    return 1.0 - float((r - v).var(unbiased=False)) / var


def add_gae_advantages(data: Any, algo: Any) -> Any:
    """GAE advantages on a DataProto of turns: adds ``advantages``, ``returns``, ``token_rewards`` (B, R) and
    ``trained_rewards`` (B,). Needs batch ``scores``, ``response_mask``, ``values`` and non_tensor
    episode_id, player, turn, agent_id (plus old/ref log-probs for algo.kl_mode=reward)."""
    from roll_ma.protocol import DataProto

    if "values" not in data.batch.keys():
        raise ValueError("algorithm.advantage=gae needs the critic's values in the batch "
                         "(train workers' compute_values) before the advantages")
    nt, mask = data.non_tensor, data.batch["response_mask"]
    trained = team_turn_rewards(data.batch["scores"].tolist(), nt["episode_id"], nt["player"], nt["turn"],
                                algo.share_reward_in_agent)  # (B,)
    token_rewards = place_on_last_token(trained, mask)  # (B, R)
    penalty = kl_reward_tokens(data, algo)  # (B, R) or None
    if penalty is not None:  # in the rewards, so GAE carries it back like any reward
        token_rewards = token_rewards + penalty
    advantages, returns = gae_advantages(token_rewards, data.batch["values"], mask, nt["episode_id"],
                                         nt["player"], nt["turn"], algo.gamma, algo.lam)
    if algo.norm_std:
        advantages = whiten_per_agent(advantages, mask, nt["agent_id"])
    return data.union(DataProto.from_dict({
        "advantages": advantages,  # (B, R)
        "returns": returns,  # (B, R) value targets
        "token_rewards": token_rewards,  # (B, R)
        "trained_rewards": torch.as_tensor(trained, dtype=torch.float32),  # (B,)
    }))


def critic_metrics(data: Any, agent_names: Sequence[str]) -> dict[str, float]:
    """critic/explained_var (all rows) and, per agent, explained_var, value_mean and return_mean, from the
    values the critic gave before this step's update and the GAE targets."""
    mask = data.batch["response_mask"]
    values, returns = data.batch["values"], data.batch["returns"]
    out = {"critic/explained_var": explained_variance(returns, values, mask)}
    ids = np.asarray([int(a) for a in data.non_tensor["agent_id"]])
    for aid, name in enumerate(agent_names):
        rows = torch.from_numpy(ids == aid)
        if not bool(rows.any()):
            continue
        m = mask.bool() & rows[:, None]
        p = f"agent/{name}/"
        out[p + "explained_var"] = explained_variance(returns, values, m)
        out[p + "value_mean"] = float(values[m].mean()) if bool(m.any()) else 0.0
        out[p + "return_mean"] = float(returns[m].mean()) if bool(m.any()) else 0.0
    return out


def team_reward_metrics(data: Any, agent_names: Sequence[str], shared: bool) -> dict[str, float]:
    """agent/<name>/reward_trained: the mean turn reward each agent trains on (with team reward an earlier
    agent's equals the last agent's; without, it stays its own agent/<name>/reward), and
    agent/<name>/reward_shared: 1 when the agent trains on the team's reward."""
    if "trained_rewards" not in data.batch.keys():
        return {}
    ids = np.asarray([int(a) for a in data.non_tensor["agent_id"]])
    out = {}
    for aid, name in enumerate(agent_names):
        rows = ids == aid
        if rows.any():
            out[f"agent/{name}/reward_trained"] = float(data.batch["trained_rewards"].numpy()[rows].mean())
            out[f"agent/{name}/reward_shared"] = float(shared)
    return out


def last_turns_only(data: Any) -> Any:
    """The rows of each (episode, player)'s last turn (train.use_all_traj=false: the last round's turns)."""
    nt = data.non_tensor
    last: dict[tuple[Any, int], int] = {}
    for i, (ep, pl, turn) in enumerate(zip(nt["episode_id"], nt["player"], nt["turn"])):
        key = (ep, int(pl))
        if key not in last or int(turn) > int(nt["turn"][last[key]]):
            last[key] = i
    return data.select_idxs(np.asarray(sorted(last.values()), dtype=np.int64))
