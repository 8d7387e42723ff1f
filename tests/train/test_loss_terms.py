"""Loss terms whose weight depends on the step reach the update with that step's weight."""

from __future__ import annotations

import torch
from train_helpers import make_batch, on_policy

from roll_ma.config.schema import AlgorithmConfig


def test_decayed_entropy_bonus_acts_until_it_reaches_zero(make_strategy):
    rows = make_batch([0, 0, 0, 0], seed=7)

    def weights_after(algo: AlgorithmConfig, step: int) -> dict[str, torch.Tensor]:
        s = make_strategy(["a0"], algo=algo)
        s.train_step(on_policy(s, rows, step=step))
        return s.adapter_tensors()["a0"]

    def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
        return all(torch.equal(a[k], b[k]) for k in a)

    plain = AlgorithmConfig()
    decayed = AlgorithmConfig(entropy_coef=1.0, entropy_decay_steps=2)  # 1.0 at step 1, 0.5 at 2, 0 from 3
    assert not same(weights_after(decayed, 2), weights_after(plain, 2))
    assert same(weights_after(decayed, 3), weights_after(plain, 3))
