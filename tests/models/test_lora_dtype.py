"""train.lora_compute_dtype=model: LoRA branches compute in the base's dtype, the weights and the optimizer
stay fp32; on an fp32 base nothing changes, bit for bit."""

from __future__ import annotations

import pytest
import torch
from train_helpers import LORA, all_finite, make_batch, on_policy

from roll_ma.config.schema import ModelConfig
from roll_ma.models.adapters import AdapterSpec, inject_adapters
from roll_ma.models.loading import load_base_model
from roll_ma.models.lora_dtype import InputDtypeLinear, compute_lora_in_input_dtype

SPECS = [AdapterSpec(name, LORA.rank, LORA.alpha, 0.0, tuple(LORA.target_modules)) for name in ("a0", "a1")]


def _model(tiny_model_dir, dtype, in_model_dtype):
    model = inject_adapters(load_base_model(ModelConfig(path=tiny_model_dir, dtype=dtype)), SPECS, seed=0)
    with torch.no_grad():  # nonzero lora_B: the branch adds something and lora_A gets gradients
        gen = torch.Generator().manual_seed(1)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    if in_model_dtype:
        assert compute_lora_in_input_dtype(model) > 0
    model.set_adapter("a1")
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name and ".a1." in name)
    return model


def _loss_and_grads(model):
    ids = torch.randint(3, 500, (3, 12), generator=torch.Generator().manual_seed(0))
    logits = model(input_ids=ids).logits  # (B, T, V)
    loss = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None]).mean()  # next tokens
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), logits.detach(), grads


def test_an_fp32_base_computes_exactly_as_before(tiny_model_dir):
    loss_a, logits_a, grads_a = _loss_and_grads(_model(tiny_model_dir, "float32", in_model_dtype=False))
    loss_b, logits_b, grads_b = _loss_and_grads(_model(tiny_model_dir, "float32", in_model_dtype=True))
    assert torch.equal(loss_a, loss_b) and torch.equal(logits_a, logits_b)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 0
    assert all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)


def test_a_bf16_base_runs_the_branch_in_bf16_with_fp32_weights_and_gradients(tiny_model_dir):
    model = _model(tiny_model_dir, "bfloat16", in_model_dtype=True)
    seen = []  # the dtype of every LoRA factor's input and output
    for module in model.modules():
        if isinstance(module, InputDtypeLinear):
            module.register_forward_hook(lambda m, args, out: seen.append((args[0].dtype, out.dtype)))
    loss, _, grads = _loss_and_grads(model)
    assert seen and set(seen) == {(torch.bfloat16, torch.bfloat16)}  # no fp32 copy of any activation
    trained = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert trained and all(p.dtype == torch.float32 for p in trained.values())
    assert set(grads) == set(trained) and all(g.dtype == torch.float32 for g in grads.values())
    # PEFT's fp32 branch on the same bf16 base: the same loss and gradients up to bf16 rounding
    ref_loss, _, ref_grads = _loss_and_grads(_model(tiny_model_dir, "bfloat16", in_model_dtype=False))
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-2)
    for n, g in ref_grads.items():
        cos = torch.nn.functional.cosine_similarity(g.flatten(), grads[n].flatten(), dim=0)
        assert cos > 0.99, (n, cos.item())


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_bf16_updates_keep_each_agent_to_its_own_fp32_adapter(make_strategy, zero_stage):
    s = make_strategy(["a0", "a1"], zero_stage=zero_stage, dtype="bfloat16", lora_compute_dtype="model")
    # the option reaches the trainer's model: its LoRA factors compute in the input's dtype
    assert any(isinstance(m, InputDtypeLinear) for m in s.weights.model.modules())
    before = s.adapter_tensors()
    batch = on_policy(s, make_batch([1] * 4, seed=3))
    metrics = s.train_step(batch).metrics
    after = s.adapter_tensors()
    assert metrics["agent/a1/updated"] == 1.0 and all_finite(metrics)
    assert all(t.dtype == torch.float32 for t in after["a1"].values())
    assert any(not torch.equal(before["a1"][n], after["a1"][n]) for n in before["a1"])
    assert all(torch.equal(before["a0"][n], after["a0"][n]) for n in before["a0"])
