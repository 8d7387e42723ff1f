"""SFT and DPO losses against hand computations on fixed log-probs."""

from __future__ import annotations

import math

import pytest
import torch

from roll_ma.algorithms.preference import dpo_loss, sequence_log_probs, sft_loss


def softplus(x: float) -> float:
    return math.log1p(math.exp(x))  # -log sigmoid(-x)


def test_dpo_loss_by_hand():
    chosen = torch.tensor([-1.0, -2.0], requires_grad=True)
    rejected = torch.tensor([-3.0, -1.0])
    ref_chosen = torch.tensor([-1.5, -2.0])
    ref_rejected = torch.tensor([-2.5, -1.5])
    loss, stats = dpo_loss(chosen, rejected, ref_chosen, ref_rejected, beta=0.5)
    # pair 0: h = (-1 - -3) - (-1.5 - -2.5) = 2 - 1 = 1;      beta h = 0.5
    #         l0 = -log sigmoid(0.5) = softplus(-0.5)
    # pair 1: h = (-2 - -1) - (-2 - -1.5) = -1 + 0.5 = -0.5;  beta h = -0.25
    #         l1 = -log sigmoid(-0.25) = softplus(0.25)
    l0, l1 = softplus(-0.5), softplus(0.25)
    assert l0 == pytest.approx(0.474077, abs=1e-6) and l1 == pytest.approx(0.825939, abs=1e-6)
    assert float(loss.detach()) == pytest.approx((l0 + l1) / 2, abs=1e-6)
    # rewards: chosen 0.5 (-1 - -1.5) = 0.25 and 0.5 (-2 - -2) = 0; rejected 0.5 (-3 - -2.5) = -0.25 and
    # 0.5 (-1 - -1.5) = 0.25; margins 0.5 and -0.25; chosen wins only in pair 0
    assert stats["rewards/chosen"].tolist() == pytest.approx([0.25, 0.0])
    assert stats["rewards/rejected"].tolist() == pytest.approx([-0.25, 0.25])
    assert stats["rewards/margins"].tolist() == pytest.approx([0.5, -0.25])
    assert stats["rewards/accuracies"].tolist() == [1.0, 0.0]
    assert stats["loss"].tolist() == pytest.approx([l0, l1], abs=1e-6)
    # d L / d chosen_i = -beta sigmoid(-beta h_i) / B: -0.5 * sigmoid(-0.5) / 2 and -0.5 * sigmoid(0.25) / 2
    loss.backward()
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert chosen.grad.tolist() == pytest.approx([-0.25 * sig(-0.5), -0.25 * sig(0.25)], abs=1e-6)


def test_dpo_label_smoothing_and_denominator():
    args = (torch.tensor([-1.0]), torch.tensor([-3.0]), torch.tensor([-1.5]), torch.tensor([-2.5]))
    # h = 1, beta h = 0.5: l = 0.9 * softplus(-0.5) + 0.1 * softplus(0.5)   (conservative DPO, eps = 0.1)
    loss, _ = dpo_loss(*args, beta=0.5, label_smoothing=0.1)
    assert float(loss) == pytest.approx(0.9 * softplus(-0.5) + 0.1 * softplus(0.5), abs=1e-6)
    # a micro-batch of a 4-pair mini-batch divides by 4, not by its own 1 pair
    quarter, _ = dpo_loss(*args, beta=0.5, denominator=4.0)
    assert float(quarter) == pytest.approx(softplus(-0.5) / 4, abs=1e-6)
    # policy == reference: h = 0 and the loss is log 2 whatever the log-probs
    same, stats = dpo_loss(
        torch.tensor([-4.0]), torch.tensor([-9.0]), torch.tensor([-4.0]), torch.tensor([-9.0]), 0.1
    )
    assert float(same) == pytest.approx(math.log(2)) and stats["rewards/accuracies"].tolist() == [0.0]
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(*args, beta=0.0)


def test_sequence_log_probs_and_sft_loss_by_hand():
    log_probs = torch.tensor([[-1.0, -2.0, -7.0], [-0.5, -9.0, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # sums over the response: -1 - 2 = -3 and -0.5 (the padding's -7, -9, -9 never count)
    assert sequence_log_probs(log_probs, mask).tolist() == [-3.0, -0.5]
    # token NLL: (1 + 2 + 0.5) / 3 tokens
    loss, stats = sft_loss(log_probs, mask)
    assert float(loss) == pytest.approx(3.5 / 3) and stats == {"nll_sum": 3.5, "tokens": 3.0}
    # a micro-batch of a mini-batch of 7 tokens divides by 7
    part, _ = sft_loss(log_probs, mask, denominator=7.0)
    assert float(part) == pytest.approx(0.5)
