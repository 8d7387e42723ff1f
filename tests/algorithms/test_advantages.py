"""Advantages and losses on tables worked out by hand (the arithmetic is in the comments)."""

import math

import numpy as np
import pytest
import torch

from roll_ma.algorithms.advantages import (
    broadcast_to_tokens,
    discounted_turn_returns,
    grpo_advantages,
    reinforce_pp_advantages,
    reverse_cumsum,
)
from roll_ma.algorithms.losses import aggregate, choice_entropy, entropy_coef_at, kl_estimate, ppo_clip_loss
from roll_ma.algorithms.turn_rewards import kl_reward_penalty, place_on_last_token


def test_turn_returns_discount_only_through_the_same_players_turns():
    # episode e: turns 0 (p0, r=1), 1 (p1, r=5), 2 (p0, r=2), 3 (p1, r=0); gamma = 0.5
    # p0: G(turn2) = 2; G(turn0) = 1 + 0.5 * 2 = 2.0
    # p1: G(turn3) = 0; G(turn1) = 5 + 0.5 * 0 = 5.0
    # episode f (p0 only): G = 3
    g = discounted_turn_returns(
        rewards=[1, 5, 2, 0, 3],
        episode_ids=["e", "e", "e", "e", "f"],
        players=[0, 1, 0, 1, 0],
        turns=[0, 1, 2, 3, 0],
        gamma=0.5,
    )
    assert g.tolist() == [2.0, 5.0, 2.0, 0.0, 3.0]


def test_grpo_normalises_within_group_and_agent():
    # group g1, agent 0: returns [1, 3] -> mean 2, population std 1 -> [-1, 1]
    # group g1, agent 1: returns [10, 10, 10] -> all equal -> zeros (no signal, no NaN)
    # group g2, agent 0: one row -> 0 (a single sample has no baseline)
    returns = [1, 10, 3, 10, 10, 7]
    groups = ["g1", "g1", "g1", "g1", "g1", "g2"]
    agents = [0, 1, 0, 1, 1, 0]
    adv = grpo_advantages(returns, groups, agents, norm_std=True, eps=0.0)
    assert adv.tolist() == [-1.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    # without std: just the centred returns
    assert grpo_advantages(returns, groups, agents, norm_std=False).tolist() == [-1, 0, 1, 0, 0, 0]


def test_reinforce_pp_uses_a_baseline_per_agent():
    # agent 0: [0, 4] -> mean 2, std 2 -> [-1, 1]; agent 1: [1, 2, 3] -> mean 2, std sqrt(2/3)
    adv = reinforce_pp_advantages([0, 1, 4, 2, 3], [0, 1, 0, 1, 1], eps=0.0)
    s = math.sqrt(2 / 3)
    assert np.allclose(adv, [-1, -1 / s, 1, 0, 1 / s])
    assert reinforce_pp_advantages([5.0], [0]).tolist() == [0.0]  # one row: no NaN


def test_token_placement_and_return_to_go():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float32)
    assert broadcast_to_tokens(np.array([2.0, -1.0, 3.0]), mask).tolist() == [
        [2, 2, 2, 0],
        [-1, 0, 0, 0],
        [0, 0, 0, 0],
    ]
    assert place_on_last_token(np.array([2.0, -1.0, 3.0]), mask).tolist() == [
        [0, 0, 2, 0],
        [-1, 0, 0, 0],
        [0, 0, 0, 0],
    ]
    # return-to-go of [1, 2, 3] is [6, 5, 3]
    vals = torch.tensor([[1.0, 2.0, 3.0, 9.0]])
    assert reverse_cumsum(vals, mask[:1]).tolist() == [[6.0, 5.0, 3.0, 0.0]]
    kl = torch.tensor([[0.5, 1.0, 0.0, 7.0]])
    assert kl_reward_penalty(kl, mask[:1], 0.1)[0].tolist() == pytest.approx([-0.05, -0.1, 0.0, 0.0])


def test_ppo_clip_loss_by_hand():
    # two tokens, advantages +1 and -1, old logp 0
    # token 1: ratio e^0.5 = 1.6487 > 1.2, A=+1: clipped term -1.2 > -1.6487 -> -1.2, clipped
    # token 2: ratio e^-0.5 = 0.6065 < 0.8 with A=-1 -> max(0.6065, 0.8) = 0.8, clipped
    # token mean = (-1.2 + 0.8) / 2 = -0.2; clip fraction 1.0
    logp = torch.tensor([[0.5, -0.5]])
    loss, stats = ppo_clip_loss(logp, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2))
    assert loss.item() == pytest.approx(-0.2, abs=1e-6)
    assert stats["clip_frac"] == 1.0
    # inside the trust region nothing is clipped: loss = -A * ratio = -1 * e^0.1
    loss, stats = ppo_clip_loss(torch.tensor([[0.1]]), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))
    assert loss.item() == pytest.approx(-math.exp(0.1)) and stats["clip_frac"] == 0.0


def test_aggregation_and_denominator_make_micro_batches_add_up():
    values = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # token mean: (1 + 2 + 3) / 3 = 2; seq mean: ((1 + 2) / 2 + 3 / 1) / 2 = 2.25
    assert aggregate(values, mask, "token_mean").item() == 2.0
    assert aggregate(values, mask, "seq_mean").item() == 2.25
    # split into two micro-batches with the global denominator 3: (3 / 3) + (3 / 3) = 2
    parts = aggregate(values[:1], mask[:1], "token_mean", 3.0) + aggregate(
        values[1:], mask[1:], "token_mean", 3.0
    )
    assert parts.item() == 2.0
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(values, mask, "sum")


def test_kl_estimators():
    logp, ref = torch.tensor([0.0, -1.0]), torch.tensor([0.0, 0.0])
    # k1 = logp - ref = [0, -1]; k3 = e^(ref - logp) - (ref - logp) - 1 = [0, e - 1 - 1]
    assert kl_estimate(logp, ref, "k1").tolist() == [0.0, -1.0]
    assert kl_estimate(logp, ref, "k3").tolist() == pytest.approx([0.0, math.e - 2])
    with pytest.raises(ValueError, match="unknown KL estimator"):
        kl_estimate(logp, ref, "k2")


def test_entropy_coef_decays_linearly_to_zero():
    # coef 0.2 over 10 steps: step 1 -> 0.2, step 6 -> 0.2 * (1 - 5/10) = 0.1, step 11 on -> 0
    assert entropy_coef_at(0.2, 10, 1) == pytest.approx(0.2)
    assert entropy_coef_at(0.2, 10, 6) == pytest.approx(0.1)
    assert entropy_coef_at(0.2, 10, 11) == 0.0
    assert entropy_coef_at(0.2, 10, 50) == 0.0
    assert entropy_coef_at(0.2, 0, 50) == pytest.approx(0.2)  # 0: constant


def test_choice_entropy_renormalises_over_a_rows_legal_answers():
    # row 0: answers with probabilities 0.05, 0.025, 0.025 (the rest of the mass is malformed text);
    #   renormalised 0.5, 0.25, 0.25 -> H = 0.5 ln 2 + 2 * 0.25 ln 4 = 1.5 ln 2
    # row 1: two equal answers and a padded third slot -> ln 2
    # row 2: no choices (a free-text turn) -> 0
    log_probs = torch.tensor([[math.log(0.05), math.log(0.025), math.log(0.025)],
                              [-3.0, -3.0, 0.0],
                              [0.0, 0.0, 0.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    h = choice_entropy(log_probs, mask)
    assert h.tolist() == pytest.approx([1.5 * math.log(2), math.log(2), 0.0], abs=1e-6)
    h.sum().backward()
    # raising H moves mass from the likelier answer to the others; padding gets no gradient, nothing is NaN
    g = log_probs.grad
    assert torch.isfinite(g).all()
    assert g[0, 0] < 0 < g[0, 1] and g[0, 1] == pytest.approx(float(g[0, 2]))
    assert g[0].sum().item() == pytest.approx(0.0, abs=1e-6)  # a shift of all scores changes nothing
    assert g[1].abs().max() < 1e-6 and g[2].abs().max() == 0  # row 1 is at its maximum already
