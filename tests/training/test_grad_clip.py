"""Gradient clipping at ZeRO-0 is roll_ma's own (DeepSpeed's walks the whole shared model per agent step):
the optimizer gets gradients of norm train.grad_clip at most, and the weights come out as DeepSpeed's own
clipping made them."""

from __future__ import annotations

import pytest
import torch
from train_helpers import make_batch, on_policy

from roll_ma.training import ds_utils


def _grad_norm(params) -> float:
    return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params
                                                       if p.grad is not None])))


@pytest.mark.parametrize("grad_clip", [1e-4, 1e6])
def test_the_optimizer_steps_on_gradients_clipped_to_grad_clip(make_strategy, grad_clip):
    s = make_strategy(["a0"], grad_clip=grad_clip)
    updater = s.updaters["a0"]
    seen = []
    step = updater.engine.step

    def recording_step(*args, **kwargs):
        seen.append(_grad_norm(updater.params))  # what the optimizer is about to use
        return step(*args, **kwargs)

    updater.engine.step = recording_step
    metrics = s.train_step(on_policy(s, make_batch([0] * 4, seed=1))).metrics
    before_clip = metrics["agent/a0/grad_norm"]  # reported as DeepSpeed reports it: before clipping
    assert len(seen) == 1 and before_clip > 1e-3
    assert seen[0] == pytest.approx(min(before_clip, grad_clip), rel=1e-4)


def test_weights_match_deepspeeds_own_clipping(make_strategy, monkeypatch):
    batch = make_batch([0] * 4, seed=2)
    ours = make_strategy(["a0"], grad_clip=1e-4)
    ours.train_step(on_policy(ours, batch))

    # the old way: DeepSpeed clips at stage 0 (its config keeps gradient_clipping), roll_ma does not
    config = ds_utils.deepspeed_config

    def deepspeed_clips(train_cfg, *args, **kwargs):
        return {**config(train_cfg, *args, **kwargs), "gradient_clipping": float(train_cfg.grad_clip)}

    monkeypatch.setattr("roll_ma.training.policy_engine.deepspeed_config", deepspeed_clips)
    theirs = make_strategy(["a0"], grad_clip=1e-4)
    monkeypatch.setattr(theirs.updaters["a0"], "_clip_local", lambda norm: None)
    theirs.train_step(on_policy(theirs, batch))
    a, b = ours.adapter_tensors()["a0"], theirs.adapter_tensors()["a0"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-7)
