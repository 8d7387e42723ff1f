"""deepspeed_train: one shared adapter, or full fine-tuning of every base weight."""

from __future__ import annotations

import os

import pytest
import torch
from train_helpers import all_finite, make_batch, on_policy

from roll_ma.config.schema import AgentConfig


def test_single_adapter_policy_trains_from_every_agent(make_strategy):
    agents = [AgentConfig(name="p0", adapter="policy"), AgentConfig(name="p1", adapter="policy")]
    s = make_strategy(agents, strategy="deepspeed_train", zero_stage=1)
    before = s.adapter_tensors()["policy"]
    metrics = s.train_step(on_policy(s, make_batch([0, 1, 1, 0], seed=50))).metrics
    after = s.adapter_tensors()["policy"]
    assert all(not torch.equal(before[k], after[k]) for k in before)
    assert metrics["agent/p0/updated"] == 1.0 and metrics["agent/p1/updated"] == 1.0 and all_finite(metrics)


def test_two_trainable_adapters_are_refused(make_strategy):
    with pytest.raises(ValueError, match="multi_agent_deepspeed"):
        make_strategy(["a0", "a1"], strategy="deepspeed_train")


def test_full_finetune_moves_base_weights(make_strategy, tmp_path):
    s = make_strategy(["player", AgentConfig(name="fixed", frozen=True)], strategy="deepspeed_train",
                      full_finetune=True, zero_stage=2, lr=1e-3)
    assert not hasattr(s.model, "peft_config")  # no adapters at all
    before = {n: p.detach().clone() for n, p in s.model.named_parameters()}
    batch = on_policy(s, make_batch([0, 1, 0, 0], seed=51))
    metrics = s.train_step(batch).metrics
    moved = [n for n, p in s.model.named_parameters() if not torch.equal(before[n], p)]
    assert len(moved) == len(before)  # every weight trains (the frozen agent's rows add nothing)
    assert metrics["agent/player/updated"] == 1.0 and metrics["agent/fixed/updated"] == 0.0
    assert all_finite(metrics)
    with pytest.raises(ValueError, match="reference.mode=worker"):
        s.compute_log_probs(batch, adapters_enabled=False)
    with pytest.raises(ValueError, match="no adapters"):
        s.adapter_tensors()

    s.save_checkpoint(tmp_path)
    fresh = make_strategy(["player", AgentConfig(name="fixed", frozen=True)], strategy="deepspeed_train",
                          full_finetune=True, zero_stage=2, lr=1e-3)
    fresh.load_checkpoint(tmp_path)
    assert torch.equal(s.compute_log_probs(batch).batch["old_log_probs"],
                       fresh.compute_log_probs(batch).batch["old_log_probs"])


def test_deepspeed_compiled_nothing(make_strategy):
    make_strategy(["a0"], zero_stage=2)
    ext_dir = os.environ["TORCH_EXTENSIONS_DIR"]
    if not os.path.basename(ext_dir).startswith("roll_ma_torch_ext_"):
        pytest.skip("TORCH_EXTENSIONS_DIR was set outside the tests")
    assert os.listdir(ext_dir) == [], f"DeepSpeed JIT-compiled ops into {ext_dir}"
