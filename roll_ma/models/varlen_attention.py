"""Attention over packed rows without padding: PyTorch's own variable-length flash attention.

Training and scoring pack a micro-batch's rows into one sequence (``train.remove_padding``,
``models/logprobs.py``). transformers' ``sdpa`` attention would then need a block-diagonal mask
over the whole packed length (quadratic in it, and off the flash kernels); flash-attn has no
binary wheel. ``roll_ma_varlen`` is a transformers attention implementation that runs packed rows
through ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention-2 kernels inside PyTorch, CUDA)
given the rows' boundaries (``cu_seq_lens_q``), and one causal ``sdpa`` call per row where that
kernel is missing (CPU). Padded batches (generation, callers that pass a mask) go to transformers'
own ``sdpa`` path unchanged, so the implementation is safe for any forward of the model.
"""

from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any

import torch

from roll_ma.config.run_plan import VARLEN_ATTENTION

NAME = VARLEN_ATTENTION  # the name the run plan's prompt-sharing rule and the config checks read
# implementations that read the rows' boundaries from cu_seq_lens_* (no mask needed for packed rows)
PACKED_IMPLEMENTATIONS = (NAME, "flash_attention_2", "flash_attention_3")


def register() -> str:
    """Register ``roll_ma_varlen`` with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    def mask(*args: Any, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor | None:
        # no padding mask: rows are packed (the attention reads their boundaries) or there is one row
        if attention_mask is None:
            return None
        # padded inputs: sdpa's own mask. The ignore: transformers passes keywords only, so *args never
        # reaches attention_mask's position; mypy cannot tell
        return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)  # type: ignore[misc]

    AttentionInterface.register(NAME, varlen_or_sdpa_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, mask)
    return NAME


def packed_boundaries(positions: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(N + 1,) int32 start offsets of the N rows of a packed sequence and the longest row's length,
    from its (L,) position ids (each row's positions start at 0)."""
    starts = torch.nonzero(positions == 0).flatten()  # (N,)
    total = torch.tensor([positions.numel()], device=positions.device)
    cu = torch.cat([starts, total]).to(torch.int32)  # (N + 1,)
    return cu, int((cu[1:] - cu[:-1]).max()) if len(starts) else 0


def varlen_or_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor, attention_mask: torch.Tensor | None, dropout: float = 0.0,
                             scaling: float | None = None, cu_seq_lens_q: torch.Tensor | None = None,
                             max_length_q: int | None = None, cu_seq_lens_k: torch.Tensor | None = None,
                             max_length_k: int | None = None, shared_kv_index: torch.Tensor | None = None,
                             **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: (B, H, T, D) query, (B, Hkv, T, D) key and value in, the
    (B, T, H, D) output out. Packed rows (B = 1, no mask; boundaries from ``cu_seq_lens_q``, which
    ``models/logprobs.py`` passes, or else from the position ids): causal attention within each row
    only. With ``shared_kv_index`` ((Lk,), ``models/shared_prefix.py``: a group's prompt shared by its
    replies) each query sequence attends to its own key sequence, gathered from the packed keys at
    those positions and delimited by ``cu_seq_lens_k``, causally aligned to the key sequence's end.
    Anything else: transformers' sdpa attention."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if cu_seq_lens_q is None and attention_mask is None:
        positions = kwargs.get("position_ids")
        if positions is not None and positions.shape[0] == 1 and bool((positions[0, 1:] == 0).any()):
            cu_seq_lens_q, max_length_q = packed_boundaries(positions[0])  # packed by another caller
    if cu_seq_lens_q is None or attention_mask is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"packed rows are one sequence (batch 1), got a batch of {query.shape[0]}")
    if dropout > 0:
        raise ValueError("packed attention has no dropout; set the model's attention_dropout to 0")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (L, H, D), (L, Hkv, D) x 2
    max_len = int(max_length_q) if max_length_q is not None else int(cu_seq_lens_q.diff().max())
    cu_k, max_k = cu_seq_lens_q, max_len
    if shared_kv_index is not None:  # each query sequence's keys: gathered (a shared prompt's once per use)
        assert cu_seq_lens_k is not None and max_length_k is not None, "shared keys come with their bounds"
        k, v, cu_k, max_k = k[shared_kv_index], v[shared_kv_index], cu_seq_lens_k, int(max_length_k)
    if q.is_cuda and _varlen_kernel() is not None:
        out = _flash_varlen(q, k, v, cu_seq_lens_q.to(torch.int32), max_len, scaling, cu_k.to(torch.int32),
                            max_k)
    else:
        out = _per_row_sdpa(q, k, v, cu_seq_lens_q, scaling, cu_k)
    return out[None], None  # (1, L, H, D)


@lru_cache(maxsize=1)
def _varlen_kernel() -> Any:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:  # torch < 2.9
        return None
    return varlen_attn


@lru_cache(maxsize=1)
def _kernel_params() -> frozenset[str]:
    return frozenset(inspect.signature(_varlen_kernel()).parameters)


def _flash_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_len: int,
                  scaling: float | None, cu_k: torch.Tensor, max_k: int) -> torch.Tensor:
    """(L, H, D) causal attention within the rows ``cu`` delimits, through torch's varlen flash kernel
    (keys: the rows ``cu_k`` delimits; the flash kernels align a causal mask to the keys' end)."""
    kernel, params = _varlen_kernel(), _kernel_params()
    causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}  # torch 2.9 vs 2.10+
    extra = {"scale": scaling} if "scale" in params else {}
    if k.shape[1] != q.shape[1] and "enable_gqa" in params:
        extra["enable_gqa"] = True
    elif k.shape[1] != q.shape[1]:  # the kernel takes equal head counts: share each kv head explicitly
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
    return kernel(q, k, v, cu, cu_k, max_len, max_k, **causal, **extra)


def _per_row_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor,
                  scaling: float | None, cu_k: torch.Tensor | None = None) -> torch.Tensor:
    """The same result, one causal sdpa call per row (CPU, or a torch without the varlen kernel); with
    ``cu_k`` a row's keys are their own sequence, longer than its queries where a shared prompt leads it
    (the mask then aligned to the keys' end, as the flash kernels do)."""
    groups = q.shape[1] // k.shape[1]
    out = torch.empty_like(q)
    bounds = cu.tolist()
    key_bounds = cu_k.tolist() if cu_k is not None else bounds
    for lo, hi, k_lo, k_hi in zip(bounds[:-1], bounds[1:], key_bounds[:-1], key_bounds[1:]):
        qi = q[lo:hi].transpose(0, 1)  # (H, l, D)
        ki, vi = (t[k_lo:k_hi].transpose(0, 1) for t in (k, v))  # (Hkv, lk, D) x 2
        if groups > 1:
            ki, vi = ki.repeat_interleave(groups, dim=0), vi.repeat_interleave(groups, dim=0)
        causal: dict[str, Any] = {"is_causal": True}
        if k_hi - k_lo != hi - lo:  # query i sees the keys up to its own place at the end: k <= i + lk - l
            causal = {"attn_mask": torch.ones(hi - lo, k_hi - k_lo, dtype=torch.bool, device=q.device).tril(
                (k_hi - k_lo) - (hi - lo))}
        out[lo:hi] = torch.nn.functional.scaled_dot_product_attention(
            qi, ki, vi, scale=scaling, **causal).transpose(0, 1)
    return out
