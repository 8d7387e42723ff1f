"""policy_plan: which policies a multi-agent trainer builds, read from the agents before any model loads.

A policy is an adapter (or all weights) with the trainable agents whose rows train it; agents sharing an
adapter share its policy (and must agree on its lr). Frozen agents have none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from roll_ma.algorithms.algorithm_registry import POLICY_LOSSES
from roll_ma.config.schema import AlgorithmConfig
from roll_ma.models.adapters import AdapterSpec, AgentSpec
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import UpdateRequest


@dataclass(frozen=True)
class PolicyPlan:
    """A trainable unit: an adapter (or all weights) and the trainable agents whose rows train it."""

    name: str
    agent_ids: tuple[int, ...]
    lr: float


def check_agents(agents: Sequence[AgentSpec], adapters: Sequence[AdapterSpec], algo_cfg: AlgorithmConfig,
                 has_adapters: bool) -> None:
    """Fail before any model loads on an unknown policy loss, agents out of id order or a missing adapter."""
    POLICY_LOSSES.get(algo_cfg.policy_loss)  # an unknown name fails here
    for i, agent in enumerate(agents):
        if agent.agent_id != i:
            raise ValueError(f"agents must be listed by agent_id; position {i} holds {agent.agent_id}")
    names = {a.name for a in adapters}
    missing = [a.name for a in agents if a.adapter not in names]
    if has_adapters and missing:
        raise ValueError(f"agents {missing} use adapters that are not among {sorted(names)}")


def plan_policies(agents: Sequence[AgentSpec], policy_of: Callable[[AgentSpec], str],
                  default_lr: float) -> list[PolicyPlan]:
    """One policy per distinct policy of the trainable agents, in config (first-use) order."""
    by_policy: dict[str, list[AgentSpec]] = {}
    for agent in agents:
        if not agent.frozen:
            by_policy.setdefault(policy_of(agent), []).append(agent)
    return [PolicyPlan(name, tuple(a.agent_id for a in members), _policy_lr(members, default_lr))
            for name, members in by_policy.items()]


def _policy_lr(agents: Sequence[AgentSpec], default_lr: float) -> float:
    lrs = {a.lr if a.lr is not None else default_lr for a in agents}
    if len(lrs) > 1:
        raise ValueError(f"agents {[a.name for a in agents]} train one policy but set different learning "
                         f"rates {sorted(lrs)}; give them the same lr")
    return lrs.pop()


def reference_copy_names(agents: Sequence[AgentSpec], enabled: bool) -> list[str]:
    """The adapters that get a frozen reference copy: every trainable one, when asked for."""
    if not enabled:
        return []
    return list(dict.fromkeys(a.adapter for a in agents if not a.frozen))


# ------------------------------------------------------------------ rows -> agents -> policies
def row_agent_ids(data: DataProto, num_agents: int) -> np.ndarray:
    """(B,) int64 the ``agent_id`` of every row, checked against the ``num_agents`` agents."""
    if "agent_id" not in data.non_tensor:
        raise ValueError("the batch has no non_tensor 'agent_id' column; every row must name its agent")
    ids = np.asarray([int(a) for a in data.non_tensor["agent_id"]], dtype=np.int64)
    bad = sorted({int(a) for a in ids if not 0 <= a < num_agents})
    if bad:
        raise ValueError(f"agent_id values {bad} are not agents; agent ids are 0..{num_agents - 1}")
    return ids


def rows_by_policy(agent_ids: np.ndarray, agents: Sequence[AgentSpec],
                   policy_of: Callable[[AgentSpec], str]) -> dict[str, np.ndarray]:
    """Row positions per policy that scores them (frozen agents' adapters included), first-use order."""
    names = np.asarray([policy_of(agents[a]) for a in agent_ids], dtype=object)
    return {name: np.nonzero(names == name)[0] for name in dict.fromkeys(names.tolist())}


def requested_plans(plans: Sequence[PolicyPlan], agents: Sequence[AgentSpec],
                    request: UpdateRequest) -> tuple[list[PolicyPlan], list[AgentSpec]]:
    """The policies an update request names (``request.policies``: the streaming sync updates one per call;
    none while ``critic_only``: critic.warmup_steps) and the agents whose rows it reports."""
    only = request.policies
    chosen = [] if request.critic_only else [p for p in plans if only is None or p.name in only]
    listed = [a for a in agents if only is None or any(a.agent_id in p.agent_ids for p in chosen)]
    return chosen, listed
