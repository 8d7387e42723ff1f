"""The decoupled PPO objective of the asynchronous loop, on known log-probs (never on engine outputs:
vLLM's LoRA log-probs are not bitwise reproducible)."""

import math

import torch

from roll_ma.algorithms.losses import behavior_weights, ppo_clip_loss


def test_weights_are_one_when_behaviour_is_the_proximal_policy():
    prox = torch.tensor([[-1.0, -2.0, -0.5]])
    weights, truncated = behavior_weights(prox, prox.clone(), cap=2.0)
    assert torch.equal(weights, torch.ones_like(prox)) and not truncated.any()
    # and the weighted loss is exactly the plain PPO loss
    logp, adv, mask = torch.tensor([[-0.9, -2.1, -0.4]]), torch.tensor([[1.0, -1.0, 0.5]]), torch.ones(1, 3)
    plain, _ = ppo_clip_loss(logp, prox, adv, mask)
    weighted, _ = ppo_clip_loss(logp, prox, adv, mask, weights=weights)
    assert torch.equal(plain, weighted)


def test_weights_by_hand_and_the_cap():
    prox = torch.tensor([[-1.0, -1.0, -3.0]])
    behav = torch.tensor([[-1.5, -0.2, -4.0]])
    weights, truncated = behavior_weights(prox, behav, cap=2.0)
    # w = min(exp(prox - behav), cap): exp(0.5) = 1.6487, exp(-0.8) = 0.4493, exp(1.0) = 2.718 -> 2.0
    torch.testing.assert_close(weights, torch.tensor([[math.exp(0.5), math.exp(-0.8), 2.0]]))
    assert truncated.tolist() == [[False, False, True]]


def test_decoupled_loss_by_hand():
    """One token: pi_behav = e^-2, pi_prox = e^-1.5, pi = e^-1.2, A = 1, eps = 0.2, cap = 2.
    w = min(e^0.5, 2) = 1.6487; r = pi / pi_prox = e^0.3 = 1.3499, clipped to 1.2;
    L = -w * min(r A, clip(r) A) = -1.6487 * 1.2 = -1.9785 (clip against pi_prox, not pi_behav)."""
    logp, prox, behav = torch.tensor([[-1.2]]), torch.tensor([[-1.5]]), torch.tensor([[-2.0]])
    weights, _ = behavior_weights(prox, behav, cap=2.0)
    loss, stats = ppo_clip_loss(logp, prox, torch.ones(1, 1), torch.ones(1, 1), 0.2, 0.2, weights=weights)
    assert math.isclose(float(loss), -math.exp(0.5) * 1.2, rel_tol=1e-6)
    assert stats["clip_frac"] == 1.0
