"""bf16 on a GPU: LoRA weights stay fp32 on a bf16 base, full fine-tuning runs DeepSpeed's bf16 optimizers.

Run on a GPU host with ``DS_ACCELERATOR=cuda pytest -m gpu tests/training`` (the suite's conftest pins
DeepSpeed to the CPU otherwise, and DeepSpeed picks its accelerator once per process).
"""

from __future__ import annotations

import os

import pytest
import torch
from train_helpers import learning_metrics, make_batch, on_policy

from roll_ma.config.schema import AgentConfig
from roll_ma.protocol.requests import UpdateRequest

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("DS_ACCELERATOR") == "cpu",
                       reason="needs CUDA and DS_ACCELERATOR unset or cuda"),
]


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_bf16_base_keeps_agents_isolated(make_strategy, zero_stage):
    s = make_strategy(["a0", "a1"], zero_stage=zero_stage, dtype="bfloat16")
    assert next(s.model.get_base_model().parameters()).dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in s.updaters["a0"].params)  # PEFT keeps LoRA in fp32
    before = s.adapter_tensors()
    s.train_step(on_policy(s, make_batch([0, 0, 0, 0], seed=90)))
    after = s.adapter_tensors()
    assert all(not torch.equal(before["a0"][k], after["a0"][k]) for k in before["a0"])
    assert all(torch.equal(before["a1"][k], after["a1"][k]) for k in before["a1"])


@pytest.mark.parametrize("zero_stage", [0, 1, 2])
def test_bf16_full_finetune_save_load(make_strategy, tmp_path, zero_stage):
    agents = ["player", AgentConfig(name="fixed", frozen=True)]
    kwargs = dict(strategy="deepspeed_train", full_finetune=True, zero_stage=zero_stage, lr=1e-3,
                  dtype="bfloat16")
    s = make_strategy(agents, **kwargs)
    before = {n: p.detach().clone() for n, p in s.model.named_parameters()}
    s.train_step(on_policy(s, make_batch([0, 1, 0, 0], seed=91)))
    assert any(not torch.equal(before[n], p) for n, p in s.model.named_parameters())
    s.save_checkpoint(tmp_path)
    fresh = make_strategy(agents, **kwargs)
    fresh.load_checkpoint(tmp_path)
    batch = make_batch([0, 0, 1], seed=92)
    assert torch.equal(s.compute_log_probs(batch).batch["old_log_probs"],
                       fresh.compute_log_probs(batch).batch["old_log_probs"])
    step = on_policy(s, make_batch([0, 0, 0], seed=93))
    request = UpdateRequest(step=1)
    ours, theirs = s.train_step(step, request).metrics, fresh.train_step(step, request).metrics
    assert learning_metrics(ours) == learning_metrics(theirs)
    assert all(torch.equal(p, q) for p, q in zip(s.model.parameters(), fresh.model.parameters(), strict=True))
