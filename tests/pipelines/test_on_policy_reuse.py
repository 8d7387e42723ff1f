"""pi_old from the update's own forward (train.reuse_update_log_probs): the same learning as its own pass.

A strictly on-policy step (one optimizer step per policy on rows of the current adapters) skips the
scoring pass of old log-probs; these tests pin that nothing else changes: loss, KL, entropy, gradient
norm and the weights after two steps equal the two-pass path's, and the trainer-vs-rollout gap the
update reports equals the one the pass gave.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from train_helpers import learning_metrics, make_batch, on_policy, snapshot

from roll_ma.config.run_plan import run_plan
from roll_ma.config.schema import AgentConfig, AlgorithmConfig, LoraConfig, RunConfig
from roll_ma.metrics import logprob_gap_metrics
from roll_ma.pipelines.rl.on_policy import old_log_probs_pass_reason
from roll_ma.protocol.requests import UpdateRequest

AGENTS = ["a0", "a1"]


def _fresh_rows(strategy, seed: int, with_ref: bool):
    """A step's rows as the rollout leaves them: rollout log-probs a little off the trainer's."""
    batch = make_batch([0, 1, 1, 0, 1, 0], seed=seed, prompt_len=7, response_len=5)
    scored = on_policy(strategy, batch, ref=with_ref)
    noise = torch.randn(scored.batch["old_log_probs"].shape, generator=torch.Generator().manual_seed(seed))
    scored.batch["rollout_log_probs"] = (scored.batch["old_log_probs"] + 0.01 * noise) * batch.batch[
        "response_mask"]
    return scored


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_reused_old_log_probs_learn_exactly_as_the_scoring_pass(make_strategy, zero_stage):
    algo = AlgorithmConfig(kl_coef=0.05)
    two_pass = make_strategy(AGENTS, zero_stage=zero_stage, algo=algo, max_tokens_per_micro_batch=40)
    reused = make_strategy(AGENTS, zero_stage=zero_stage, algo=algo, max_tokens_per_micro_batch=40)
    for step, seed in enumerate((1, 2)):
        rows = _fresh_rows(two_pass, seed, with_ref=True)
        request = UpdateRequest(step=step)
        without_old = rows.select(batch_keys=[k for k in rows.batch.keys() if k != "old_log_probs"])
        m_two = learning_metrics(two_pass.train_step(rows, request).metrics)
        m_reused = learning_metrics(reused.train_step(without_old, request).metrics)
        for key, value in m_two.items():
            assert m_reused[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
        assert m_reused["agent/a0/policy_loss"] != 0.0 and m_reused["agent/a1/grad_norm"] > 0
        # the gap the update reports (the pass reported it before) is the pass's own number
        gap_pass = logprob_gap_metrics(rows, AGENTS)
        for key, value in gap_pass.items():
            assert m_reused[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    w_two, w_reused = snapshot(two_pass), snapshot(reused)
    for adapter in w_two:
        for name in w_two[adapter]:
            torch.testing.assert_close(w_reused[adapter][name], w_two[adapter][name], rtol=1e-5, atol=1e-7)


def test_rows_without_old_log_probs_are_refused_where_pi_old_is_not_the_forward(make_strategy):
    several_steps = make_strategy(AGENTS, mini_batch_size=2)
    rows = make_batch([0, 1, 0, 1, 0, 1], seed=3)
    rows = rows.select(batch_keys=[k for k in rows.batch.keys() if k != "old_log_probs"])
    with pytest.raises(ValueError, match="carry no old_log_probs.*one mini-batch"):
        several_steps.train_step(rows)
    two_epochs = make_strategy(AGENTS, ppo_epochs=2)
    with pytest.raises(ValueError, match="carry no old_log_probs"):
        two_epochs.train_step(rows)


def _cfg(**sections) -> RunConfig:
    cfg = RunConfig(agents=[AgentConfig(name="a"), AgentConfig(name="b")])
    for section, values in sections.items():
        setattr(cfg, section, dataclasses.replace(getattr(cfg, section), **values))
    return cfg


def _reason(cfg: RunConfig, num_rows: int = 64) -> str | None:
    """Why a step of ``num_rows`` rows of ``cfg`` scores pi_old in a pass of its own (its plan's agents)."""
    return old_log_probs_pass_reason(cfg, run_plan(cfg), num_rows)


def test_the_pass_runs_exactly_when_pi_old_differs_from_the_update_forward():
    assert _reason(_cfg()) is None
    assert _reason(_cfg(train={"mini_batch_size": 64})) is None
    cases = {
        "reuse_update_log_probs=false": _cfg(train={"reuse_update_log_probs": False}),
        "max_staleness": _cfg(rollout={"max_staleness": 1}),
        "ppo_epochs": _cfg(train={"ppo_epochs": 2}),
        "mini_batch_size": _cfg(train={"mini_batch_size": 16}),
        "kl_mode=reward": _cfg(algorithm={"kl_coef": 0.01, "kl_mode": "reward"}),
        "dropout": _cfg(lora=dataclasses.asdict(LoraConfig(dropout=0.05))),
    }
    for expected, cfg in cases.items():
        reason = _reason(cfg)
        assert reason is not None and expected in reason, (expected, reason)
    per_agent = _cfg()
    per_agent.agents[1] = dataclasses.replace(
        per_agent.agents[1], lora=dataclasses.replace(per_agent.agents[1].lora, dropout=0.1))
    assert "dropout" in _reason(per_agent)
    # kl in the reward with a zero coefficient adds nothing before the update
    assert _reason(_cfg(algorithm={"kl_coef": 0.0, "kl_mode": "reward"})) is None


def test_gap_metric_needs_rollout_log_probs_only(make_strategy):
    """Without the engine's log-probs (rollout.log_probs=false) the update reports no gap, and trains."""
    s = make_strategy(AGENTS)
    rows = make_batch([0, 1, 0, 1], seed=6)
    rows = rows.select(batch_keys=[k for k in rows.batch.keys() if k != "old_log_probs"])
    metrics = s.train_step(rows).metrics
    assert not any(k.endswith("logprob_gap") for k in metrics)
    assert np.isfinite(metrics["agent/a0/policy_loss"]) and metrics["agent/a0/updated"] == 1.0


def test_agents_the_update_leaves_alone_are_scored_for_their_gap():
    """Their trainer-vs-rollout gap cannot come from the update: frozen agents, agents not due this step
    (their own update_every, or train.train_cycle), and every agent while the critic warms up."""
    cfg = _cfg()
    cfg.agents = [AgentConfig(name="a"), AgentConfig(name="b", frozen=True),
                  AgentConfig(name="c", update_every=2)]
    plan = run_plan(cfg)
    assert plan.idle_agents(step=1) == [1, 2]
    assert plan.idle_agents(step=2) == [1]
    cycle = run_plan(_cfg(train={"train_cycle": 3}))
    assert cycle.idle_agents(step=3) == [] and cycle.idle_agents(step=4) == [0, 1]
    warm = run_plan(_cfg(algorithm={"advantage": "gae"}, critic={"warmup_steps": 2}))
    assert warm.idle_agents(step=2) == [0, 1] and warm.idle_agents(step=3) == []
