"""Which policies a multi-agent trainer builds, and the checks before any model loads (policy_plan)."""

from __future__ import annotations

import pytest

from roll_ma.config.schema import AlgorithmConfig
from roll_ma.models.adapters import AdapterSpec, AgentSpec
from roll_ma.training.policy_plan import PolicyPlan, check_agents, plan_policies


def _policy(agent: AgentSpec) -> str:
    return agent.adapter


def test_one_policy_per_trainable_adapter_in_first_use_order():
    agents = [AgentSpec(0, "a", "y"), AgentSpec(1, "b", "x", frozen=True), AgentSpec(2, "c", "y"),
              AgentSpec(3, "d", "z", lr=0.5)]
    assert plan_policies(agents, _policy, 0.1) == [PolicyPlan("y", (0, 2), 0.1), PolicyPlan("z", (3,), 0.5)]


def test_agents_sharing_a_policy_must_agree_on_its_lr():
    agents = [AgentSpec(0, "a", "y"), AgentSpec(1, "b", "y", lr=0.5)]
    with pytest.raises(ValueError, match=r"\['a', 'b'\] train one policy but set different learning rates"):
        plan_policies(agents, _policy, 0.1)


def test_check_agents_names_what_is_wrong():
    adapters = [AdapterSpec("x", 4, 8.0, 0.0, ("q_proj",))]
    algo = AlgorithmConfig()
    check_agents([AgentSpec(0, "a", "x")], adapters, algo, has_adapters=True)
    with pytest.raises(ValueError, match="position 0 holds 1"):
        check_agents([AgentSpec(1, "a", "x")], adapters, algo, has_adapters=True)
    with pytest.raises(ValueError, match=r"agents \['b'\] use adapters that are not among \['x'\]"):
        check_agents([AgentSpec(0, "a", "x"), AgentSpec(1, "b", "w")], adapters, algo, has_adapters=True)
    check_agents([AgentSpec(0, "a", "w")], adapters, algo, has_adapters=False)  # full fine-tuning
