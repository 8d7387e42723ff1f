"""A group's prompt packed once (``models/shared_prefix.py``): the layout, and attention in which every
reply sees the shared prompt and itself exactly as it did as its own row."""

from __future__ import annotations

import pytest
import torch

from roll_ma.models.shared_prefix import shared_layout
from roll_ma.models.varlen_attention import _per_row_sdpa, varlen_or_sdpa_attention
from roll_ma.packing import pack_sequences


class _Attn(torch.nn.Module):
    is_causal = True


def _rows():
    """Rows 0 and 2 share prompt [5, 6, 7]; row 1 is alone (prompt [8, 9])."""
    t = pack_sequences([[5, 6, 7], [8, 9], [5, 6, 7]], [[10, 11], [12], [13, 14, 15]], 0)
    return t["input_ids"], t["attention_mask"], t["responses"].shape[1]


def test_layout_runs_each_group_prompt_once():
    ids, attn, r = _rows()
    layout = shared_layout(ids, attn, r, torch.tensor([0, 1, 0]))
    # [prompt, reply_0, reply_2] then the lone row as one sequence
    assert layout.flat_ids.tolist() == [5, 6, 7, 10, 11, 13, 14, 15, 8, 9, 12]
    assert layout.positions.tolist() == [0, 1, 2, 3, 4, 3, 4, 5, 0, 1, 2]
    assert layout.cu_q.tolist() == [0, 3, 5, 8, 11]  # prompt, reply_0, reply_2, lone row
    assert layout.kv_index.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 5, 6, 7, 8, 9, 10]
    assert layout.cu_k.tolist() == [0, 3, 8, 14, 17] and (layout.max_q, layout.max_k) == (3, 6)
    # row-major response tokens; each reply's first token predicted by the prompt's last position (2)
    assert layout.target_index.tolist() == [3, 4, 10, 5, 6, 7]
    assert layout.hidden_index.tolist() == [2, 3, 9, 2, 5, 6]
    # a group whose prompts share no first token runs row by row, as without sharing
    apart = shared_layout(ids, attn, r, torch.tensor([0, 0, 0]))
    alone = shared_layout(ids, attn, r, torch.tensor([0, 1, 2]))
    row_by_row = [5, 6, 7, 10, 11, 8, 9, 12, 5, 6, 7, 13, 14, 15]
    assert apart.flat_ids.tolist() == alone.flat_ids.tolist() == row_by_row
    assert apart.cu_q.tolist() == alone.cu_q.tolist() == [0, 5, 8, 14]


def test_rows_that_branch_from_one_history_run_their_common_prefix_once():
    """Prompts [5, 6, 7, 1] and [5, 6, 7, 2, 3] share [5, 6, 7]: it runs once; each row's own prompt tokens
    and reply follow it, the reply's first token predicted by the row's own last prompt token."""
    t = pack_sequences([[5, 6, 7, 1], [5, 6, 7, 2, 3]], [[10, 11], [12]], 0)
    layout = shared_layout(t["input_ids"], t["attention_mask"], t["responses"].shape[1], torch.tensor([0, 0]))
    assert layout.flat_ids.tolist() == [5, 6, 7, 1, 10, 11, 2, 3, 12]
    assert layout.positions.tolist() == [0, 1, 2, 3, 4, 5, 3, 4, 5]
    assert layout.cu_q.tolist() == [0, 3, 6, 9]  # the prefix, row 0's rest, row 1's rest
    assert layout.kv_index.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 5, 0, 1, 2, 6, 7, 8]
    assert layout.target_index.tolist() == [4, 5, 8] and layout.hidden_index.tolist() == [3, 4, 7]
    q, k, v = _qkv(len(layout.flat_ids))
    out, _ = varlen_or_sdpa_attention(_Attn(), q, k, v, None, **layout.attention_kwargs())  # (1, L, H, D)
    groups = q.shape[1] // k.shape[1]
    for rows in ([0, 1, 2, 3, 4, 5], [0, 1, 2, 6, 7, 8]):  # each row as it was, alone
        kr, vr = (t[:, :, rows].repeat_interleave(groups, 1) for t in (k, v))
        want = torch.nn.functional.scaled_dot_product_attention(q[:, :, rows], kr, vr, is_causal=True)
        torch.testing.assert_close(out[:, rows], want.transpose(1, 2), rtol=1e-5, atol=1e-6)


def _qkv(length: int, heads: int = 4, kv_heads: int = 2, dim: int = 8, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, heads, length, dim, generator=gen)  # (1, H, L, D)
    k, v = (torch.randn(1, kv_heads, length, dim, generator=gen) for _ in range(2))  # (1, Hkv, L, D) x 2
    return q, k, v


def test_every_reply_attends_to_the_shared_prompt_and_itself_only():
    ids, attn, r = _rows()
    layout = shared_layout(ids, attn, r, torch.tensor([0, 1, 0]))
    q, k, v = _qkv(len(layout.flat_ids))
    out, _ = varlen_or_sdpa_attention(_Attn(), q, k, v, None, **layout.attention_kwargs())  # (1, L, H, D)
    groups = q.shape[1] // k.shape[1]
    for rows in ([0, 1, 2, 3, 4], [0, 1, 2, 5, 6, 7], [8, 9, 10]):  # each row as it was, alone
        kr, vr = (t[:, :, rows].repeat_interleave(groups, 1) for t in (k, v))
        want = torch.nn.functional.scaled_dot_product_attention(q[:, :, rows], kr, vr, is_causal=True)
        torch.testing.assert_close(out[:, rows], want.transpose(1, 2), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("branch", [False, True], ids=["one_prompt", "branching_prompts"])
def test_cuda_varlen_kernel_with_shared_keys_equals_per_row_sdpa(branch):
    """The flash kernel aligns a causal mask to the keys' end, as the CPU path spells out (branching: each
    row's prompt goes on with tokens of its own after the shared 300 or 40)."""
    prompts, replies = [[3] * 300, [4] * 40], [[[5] * 700, [6] * 9, [7] * 128], [[8] * 513]]
    rows = [(p + ([9] * (17 * k + 1) if branch else []), rep)
            for p, reps in zip(prompts, replies) for k, rep in enumerate(reps)]
    t = pack_sequences([p for p, _ in rows], [rep for _, rep in rows], 0)
    layout = shared_layout(t["input_ids"], t["attention_mask"], t["responses"].shape[1],
                           torch.tensor([0, 0, 0, 1]))
    qkv = _qkv(len(layout.flat_ids), 28, 4, 128, 1)
    q, k, v = (x.cuda().to(torch.bfloat16).requires_grad_() for x in qkv)
    kwargs = {key: (x.cuda() if isinstance(x, torch.Tensor) else x)
              for key, x in layout.attention_kwargs().items()}
    out, _ = varlen_or_sdpa_attention(_Attn(), q, k, v, None, **kwargs)
    out.float().square().sum().backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    index = kwargs["shared_kv_index"]
    qq, kk, vv = (x[0].transpose(0, 1) for x in (q, k, v))
    want = _per_row_sdpa(qq, kk[index], vv[index], kwargs["cu_seq_lens_q"], None,
                         kwargs["cu_seq_lens_k"])[None]  # (1, L, H, D)
    want.float().square().sum().backward()
    torch.testing.assert_close(out.float(), want.float(), rtol=2e-2, atol=2e-2)
    for g, x in zip(grads, (q, k, v)):
        relative = (g.float() - x.grad.float()).norm() / x.grad.float().norm()
        assert relative < 1e-2, float(relative)
