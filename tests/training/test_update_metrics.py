"""The names and sums of a multi-agent update's metrics (update_metrics)."""

from __future__ import annotations

import numpy as np

from roll_ma.models.adapters import AgentSpec
from roll_ma.training.update_loop import PolicyUpdate
from roll_ma.training.update_metrics import agent_row_metrics, agent_update_metrics, token_totals

AGENTS = [AgentSpec(0, "a", "x"), AgentSpec(1, "b", "x"), AgentSpec(2, "c", "y")]


def test_every_listed_agent_reports_its_rows_and_tokens_and_not_yet_updated():
    ids = np.array([0, 2, 0])
    metrics = agent_row_metrics(AGENTS[:2], ids, np.array([3.0, 5.0, 4.0]))
    assert metrics == {"agent/a/rows": 2.0, "agent/a/tokens": 7.0, "agent/a/updated": 0.0,
                       "agent/b/rows": 0.0, "agent/b/tokens": 0.0, "agent/b/updated": 0.0}


def test_an_update_reports_under_the_agents_with_rows_in_it_only():
    result = PolicyUpdate(agent_metrics={0: {"loss": 1.5}, 1: {"loss": 9.0}}, optimizer_steps=2,
                          grad_norm=0.5, lr=0.1, skipped_nonfinite=1)
    metrics: dict[str, float] = {}
    stepped = agent_update_metrics(metrics, result, np.array([0, 0]), AGENTS)
    assert stepped == [0]
    assert metrics == {"agent/a/loss": 1.5, "agent/a/grad_norm": 0.5, "agent/a/lr": 0.1,
                       "agent/a/updated": 1.0, "agent/a/skipped_nonfinite": 1.0}
    metrics = {}
    assert agent_update_metrics(metrics, PolicyUpdate(agent_metrics={0: {}}), np.array([0]), AGENTS) == []
    assert metrics["agent/a/updated"] == 0.0


def test_token_totals_sum_every_agents_input_tokens():
    metrics = {"agent/a/input_tokens": 10.0, "agent/a/input_tokens_run": 6.0, "agent/b/input_tokens": 4.0,
               "agent/b/input_tokens_run": 4.0, "critic/x/input_tokens": 99.0}
    assert token_totals(metrics) == {"train/tokens": 14.0, "train/tokens_deduplicated": 10.0}
    assert token_totals({"agent/a/rows": 1.0}) == {}
