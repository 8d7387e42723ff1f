"""A user's registered advantage estimator and policy loss drive a real update of the tiny model."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from train_helpers import make_batch, on_policy

from roll_ma.algorithms.advantages import add_advantages
from roll_ma.algorithms.algorithm_registry import register_advantage_estimator, register_policy_loss
from roll_ma.algorithms.losses import ppo_clip_policy_loss
from roll_ma.config.schema import AlgorithmConfig
from roll_ma.protocol.requests import UpdateRequest

CALLS: list[str] = []


@register_policy_loss("tripled")
def tripled_ppo(log_probs, old_log_probs, advantages, mask, algo, denominator, weights):
    """PPO's clipped loss times 3: its gradient and its reported ``policy_loss`` are 3x the default's."""
    CALLS.append("loss")
    loss, stats = ppo_clip_policy_loss(log_probs, old_log_probs, advantages, mask, algo, denominator, weights)
    return 3.0 * loss, stats


@register_advantage_estimator("signs")
def sign_of_return(returns: np.ndarray, rows, algo) -> np.ndarray:
    """+1 above the batch mean, -1 below: a user's estimator."""
    CALLS.append("estimator")
    return np.sign(returns - returns.mean())


def scored_turns(strategy, seed: int):
    """Rows of agent 0 with env scores and the turn columns the advantage code reads."""
    batch = make_batch([0, 0, 0, 0], seed=seed)
    n = len(batch)
    batch.batch["scores"] = torch.tensor([1.0, 0.0, 1.0, 0.0])
    batch.non_tensor.update(episode_id=np.array([f"e{i}" for i in range(n)], dtype=object),
                            player=np.zeros(n, dtype=np.int64), turn=np.zeros(n, dtype=np.int64),
                            group_id=np.array(["g"] * n, dtype=object))
    batch = on_policy(strategy, batch)
    batch.pop("advantages")  # make_batch's own: the registered estimator computes them
    return batch


def test_a_registered_estimator_and_policy_loss_train_the_policy(make_strategy):
    algo = AlgorithmConfig(advantage="signs", policy_loss="tripled")
    default, tripled = make_strategy(["a0"]), make_strategy(["a0"], algo=algo)
    CALLS.clear()
    batch = add_advantages(scored_turns(tripled, seed=3), algo)
    assert batch.batch["advantages"][:, 0].tolist() == [1.0, -1.0, 1.0, -1.0]
    before = tripled.adapter_tensors()["a0"]
    m = tripled.train_step(batch, UpdateRequest(step=1)).metrics
    assert CALLS[0] == "estimator" and "loss" in CALLS
    assert m["agent/a0/updated"] == 1.0
    after = tripled.adapter_tensors()["a0"]
    assert any(not torch.equal(before[k], after[k]) for k in before)
    # the same rows under the default loss: the registered one reported 3x its policy loss
    rows = add_advantages(scored_turns(default, seed=3), algo)
    m_default = default.train_step(rows, UpdateRequest(step=1)).metrics
    assert m["agent/a0/policy_loss"] == pytest.approx(3.0 * m_default["agent/a0/policy_loss"], rel=1e-5)


def test_an_unknown_policy_loss_fails_when_the_strategy_is_built(make_strategy):
    with pytest.raises(ValueError, match=r"algorithm.policy_loss='nope'.*registered:.*ppo_clip"):
        make_strategy(["a0"], algo=AlgorithmConfig(policy_loss="nope"))
