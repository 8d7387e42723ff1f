"""Packed rows through ``roll_ma_varlen``: the same log-probs and gradients as padded rows under sdpa.

The train and reference models load with ``roll_ma_varlen`` (``models/varlen_attention.py``): packed
micro-batches pass their rows' boundaries to one variable-length attention call per layer (torch's
flash kernel on CUDA, one causal sdpa call per row on CPU); padded ones go through sdpa unchanged.
"""

from __future__ import annotations

import pytest
import torch
from train_helpers import LORA, make_batch

from roll_ma.config.schema import ModelConfig
from roll_ma.models.adapters import AdapterSpec, inject_adapters
from roll_ma.models.loading import load_base_model
from roll_ma.models.logprobs import response_log_probs
from roll_ma.models.varlen_attention import (
    NAME,
    _per_row_sdpa,
    packed_boundaries,
    varlen_or_sdpa_attention,
)


def _lora_model(model_dir: str, packed_rows: bool, dtype: str = "float32", device: str = "cpu"):
    spec = AdapterSpec("a0", LORA.rank, LORA.alpha, 0.0, tuple(LORA.target_modules))
    model = inject_adapters(load_base_model(ModelConfig(path=model_dir, dtype=dtype), device,
                                            packed_rows=packed_rows), [spec], seed=0)
    model.set_adapter("a0")
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_((torch.randn(p.shape, generator=gen) * 0.1).to(p.dtype))
    return model.train()  # dropout is 0: train mode only lets gradients flow as in the update


def _log_probs_and_grads(model, batch, remove_padding: bool, device: str = "cpu"):
    ids, attn = batch.batch["input_ids"].to(device), batch.batch["attention_mask"].to(device)
    resp = attn[:, -6:].float()
    model.zero_grad(set_to_none=True)
    lp, ent = response_log_probs(model, ids, attn, 6, with_entropy=True, remove_padding=remove_padding,
                                 chunk_tokens=5)
    (lp * resp).sum().add((ent * resp).sum() * 0.1).backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return lp.detach().float(), ent.detach().float(), grads


def test_train_models_load_with_the_packed_attention(tiny_model_dir):
    assert _lora_model(tiny_model_dir, packed_rows=True).config._attn_implementation == NAME
    assert _lora_model(tiny_model_dir, packed_rows=False).config._attn_implementation == "sdpa"
    chosen = load_base_model(ModelConfig(path=tiny_model_dir, attn_implementation="eager"), packed_rows=True)
    assert chosen.config._attn_implementation == "eager"  # a user's choice wins


def test_packed_varlen_rows_equal_padded_sdpa_rows_values_and_gradients(tiny_model_dir):
    batch = make_batch([0] * 6, seed=11, prompt_len=9, response_len=6)
    padded_sdpa = _log_probs_and_grads(_lora_model(tiny_model_dir, False), batch, remove_padding=False)
    packed_varlen = _log_probs_and_grads(_lora_model(tiny_model_dir, True), batch, remove_padding=True)
    padded_varlen = _log_probs_and_grads(_lora_model(tiny_model_dir, True), batch, remove_padding=False)
    for got in (packed_varlen, padded_varlen):
        torch.testing.assert_close(got[0], padded_sdpa[0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got[1], padded_sdpa[1], rtol=1e-4, atol=1e-5)
        assert got[2].keys() == padded_sdpa[2].keys() and got[2]
        for name, g in padded_sdpa[2].items():
            torch.testing.assert_close(got[2][name], g, rtol=1e-3, atol=1e-6, msg=name)


class _Attn(torch.nn.Module):
    is_causal = True


def _packed_qkv(lengths: list[int], heads: int = 4, kv_heads: int = 2, dim: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q = torch.randn(1, heads, total, dim, generator=gen)  # (1, H, L, D)
    k = torch.randn(1, kv_heads, total, dim, generator=gen)  # (1, Hkv, L, D)
    v = torch.randn(1, kv_heads, total, dim, generator=gen)
    positions = torch.cat([torch.arange(n) for n in lengths])[None]  # (1, L)
    return q, k, v, positions


def test_each_packed_row_attends_only_to_itself_causally():
    lengths = [3, 1, 5, 2]
    q, k, v, positions = _packed_qkv(lengths)
    cu, longest = packed_boundaries(positions[0])
    assert cu.tolist() == [0, 3, 4, 9, 11] and longest == 5
    out, _ = varlen_or_sdpa_attention(_Attn(), q, k, v, None, cu_seq_lens_q=cu, max_length_q=longest)
    assert out.shape == (1, 11, 4, 8)
    groups = q.shape[1] // k.shape[1]
    for lo, hi in zip(cu[:-1].tolist(), cu[1:].tolist()):  # every row alone, GQA spelled out
        kr, vr = (t[:, :, lo:hi].repeat_interleave(groups, 1) for t in (k, v))
        want = torch.nn.functional.scaled_dot_product_attention(
            q[:, :, lo:hi], kr, vr, is_causal=True).transpose(1, 2)  # (1, l, H, D)
        torch.testing.assert_close(out[:, lo:hi], want, rtol=1e-5, atol=1e-6)
    # a caller that packs rows without passing the boundaries gets them from the position ids
    again, _ = varlen_or_sdpa_attention(_Attn(), q, k, v, None, position_ids=positions)
    torch.testing.assert_close(again, out)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_varlen_kernel_equals_per_row_sdpa_forward_and_backward():
    lengths = [700, 33, 1024, 5, 300]
    q, k, v, positions = (t.cuda() for t in _packed_qkv(lengths, heads=28, kv_heads=4, dim=128, seed=1))
    q, k, v = (t.to(torch.bfloat16).requires_grad_() for t in (q, k, v))
    cu, longest = packed_boundaries(positions[0])
    out, _ = varlen_or_sdpa_attention(_Attn(), q, k, v, None, cu_seq_lens_q=cu, max_length_q=longest)
    out.float().square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    want = _per_row_sdpa(*(t[0].transpose(0, 1) for t in (q, k, v)), cu, None)[None]
    want.float().square().sum().backward()
    torch.testing.assert_close(out.float(), want.float(), rtol=2e-2, atol=2e-2)
    for g, t in zip(grads, (q, k, v)):  # bf16: a few elements differ by a rounding step (0.09 of ~3)
        relative = (g.float() - t.grad.float()).norm() / t.grad.float().norm()
        assert relative < 1e-2, float(relative)
