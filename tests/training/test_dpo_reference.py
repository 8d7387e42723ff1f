"""DPO's reference copies (dpo_reference): which adapters get one, and a strategy built without them."""

from __future__ import annotations

import pytest

from roll_ma.models.adapters import AgentSpec
from roll_ma.training.policy_plan import reference_copy_names


def test_every_trainable_adapter_gets_one_copy_when_asked_for():
    agents = [AgentSpec(0, "a", "y"), AgentSpec(1, "b", "x", frozen=True), AgentSpec(2, "c", "y"),
              AgentSpec(3, "d", "z")]
    assert reference_copy_names(agents, enabled=True) == ["y", "z"]
    assert reference_copy_names(agents, enabled=False) == []


def test_snapshot_without_copies_names_the_setting(make_strategy):
    strategy = make_strategy(["a", "b"])
    with pytest.raises(ValueError, match="reference_copies=False"):
        strategy.snapshot_reference()
