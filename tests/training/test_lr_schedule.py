"""Learning-rate schedules: linear warmup, then constant / linear / cosine decay to the horizon."""

from __future__ import annotations

import pytest
from train_helpers import make_batch, on_policy

from roll_ma.protocol.requests import UpdateRequest
from roll_ma.training.lr_schedule import WarmupDecay


def test_schedule_shapes():
    # warmup 2 of 10 steps: step s uses lr * f(s)
    assert [WarmupDecay("constant", 2, 10)(s) for s in (0, 1, 2, 9)] == [0.5, 1.0, 1.0, 1.0]
    linear = WarmupDecay("linear", 2, 10)
    assert [linear(s) for s in (0, 1, 2, 6, 10, 50)] == [0.5, 1.0, 1.0, 0.5, 0.0, 0.0]
    cosine = WarmupDecay("cosine", 0, 10)
    assert cosine(0) == 1.0 and cosine(5) == pytest.approx(0.5) and cosine(10) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="lr_schedule"):
        WarmupDecay("step", 0, 10)


def test_each_adapter_warms_up_on_its_own_clock(make_strategy):
    s = make_strategy(["a0", "a1"], lr=1e-2, warmup_steps=2)
    m = s.train_step(on_policy(s, make_batch([0, 0], seed=80))).metrics
    assert m["agent/a0/lr"] == pytest.approx(5e-3)
    m = s.train_step(on_policy(s, make_batch([0, 1], seed=81)), UpdateRequest(step=1)).metrics
    assert m["agent/a0/lr"] == pytest.approx(1e-2) and m["agent/a1/lr"] == pytest.approx(5e-3)
