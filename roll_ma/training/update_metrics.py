"""update_metrics: the names and sums of a multi-agent update's metrics (``agent/<name>/...``, ``train/...``).

Every agent the step covers reports its rows, tokens and whether its policy stepped; an agent with rows
in an update also reports that update's numbers (its loss terms, the policy's grad norm and lr).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from roll_ma.models.adapters import AgentSpec
from roll_ma.training.update_loop import PolicyUpdate


def agent_row_metrics(agents: Sequence[AgentSpec], agent_ids: np.ndarray,
                      row_tokens: np.ndarray) -> dict[str, float]:
    """``agent/<name>/rows``, ``/tokens`` (as the objective counts) and ``/updated`` = 0 of each agent."""
    metrics: dict[str, float] = {}
    for agent in agents:
        mine = agent_ids == agent.agent_id
        prefix = f"agent/{agent.name}/"
        metrics[prefix + "rows"] = float(mine.sum())
        metrics[prefix + "tokens"] = float(row_tokens[mine].sum())
        metrics[prefix + "updated"] = 0.0
    return metrics


def agent_update_metrics(metrics: dict[str, float], result: PolicyUpdate, agent_ids: np.ndarray,
                         agents: Sequence[AgentSpec]) -> list[int]:
    """Add one policy update's numbers under each agent with rows in it (``agent_ids``: the update's rows);
    returns the agents whose policy took an optimizer step."""
    stepped = result.optimizer_steps > 0
    stepped_agents = []
    for agent_id, agent_metrics in result.agent_metrics.items():
        if not (agent_ids == agent_id).any():
            continue
        prefix = f"agent/{agents[agent_id].name}/"
        metrics.update({prefix + k: v for k, v in agent_metrics.items()})
        metrics.update({prefix + "grad_norm": result.grad_norm, prefix + "lr": result.lr,
                        prefix + "updated": float(stepped),
                        prefix + "skipped_nonfinite": float(result.skipped_nonfinite)})
        if stepped:
            stepped_agents.append(agent_id)
    return stepped_agents


def token_totals(metrics: dict[str, float]) -> dict[str, float]:
    """The step's trainer tokens (every agent's prompt + response tokens, x epochs) and those the update
    ran: fewer by each repeated prompt under train.share_prompt_prefix (the GPU table's figure); none when
    no agent reports ``input_tokens``."""
    inputs = [v for k, v in metrics.items() if k.startswith("agent/") and k.endswith("/input_tokens")]
    if not inputs:
        return {}
    run = [v for k, v in metrics.items() if k.startswith("agent/") and k.endswith("/input_tokens_run")]
    return {"train/tokens": float(sum(inputs)), "train/tokens_deduplicated": float(sum(run))}
