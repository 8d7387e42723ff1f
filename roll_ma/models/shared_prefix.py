"""A group's prompt run once: the packed layout in which each reply attends to one shared copy of it.

A GRPO group's samples repeat one prompt; packed one row after another (``train.remove_padding``) the
prompt's tokens run once per sample. With ``train.share_prompt_prefix`` a group (rows of one adapter whose
prompts are identical, or which branch from one history: ``packing.prompt_groups``) becomes one segment
``[prefix, rest_1, ..., rest_K]``: the prefix their prompts share at positions 0..P-1, then each row's rest
(its own prompt tokens after the prefix, S_i of them, and its reply, R_i) at P..P+S_i+R_i-1. Attention
runs per QUERY sequence, each with its own KEY sequence (``roll_ma_varlen``: ``shared_kv_index``):

    queries               keys (gathered from the packed sequence)   mask
    prefix (P)            prefix                                       causal
    rest_i (S_i + R_i)    prefix + rest_i (P + S_i + R_i)              causal, aligned bottom-right

so rest_i sees exactly what it saw as its own row, never rest_j; a lone row stays one sequence. A reply's
first token is predicted from the last hidden state before it (the row's own prompt, or the shared prefix
where the prompts are identical: S_i = 0), the rest from the reply's own positions. The gather's backward
sums the gradient of every row into the shared prefix's keys and values, which is what the repeated
prompts gave. (The idea: "Prefix Grouper", arXiv 2506.05433.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from roll_ma.packing import common_prefix_len


@dataclass
class SharedLayout:
    """One micro-batch's rows with each group's prompt once.

    flat_ids, positions: (L,) the packed tokens and their position ids.
    cu_q, cu_k: (S + 1,) int32 starts of the S query sequences in the packed tokens and of their key
        sequences in ``kv_index``; max_q, max_k: the longest of each.
    kv_index: (Lk,) packed position of every key of every key sequence, one after another.
    hidden_index, target_index: (N,) packed position of the hidden state that predicts each response
        token and of that token, the rows' response tokens in row-major order.
    """

    flat_ids: torch.Tensor
    positions: torch.Tensor
    cu_q: torch.Tensor
    cu_k: torch.Tensor
    max_q: int
    max_k: int
    kv_index: torch.Tensor
    hidden_index: torch.Tensor
    target_index: torch.Tensor

    def attention_kwargs(self) -> dict[str, Any]:
        """What ``roll_ma_varlen`` reads (through the decoder's forward kwargs)."""
        return {"cu_seq_lens_q": self.cu_q, "cu_seq_lens_k": self.cu_k, "max_length_q": self.max_q,
                "max_length_k": self.max_k, "shared_kv_index": self.kv_index}


def shared_layout(ids: torch.Tensor, attn: torch.Tensor, resp_len: int, groups: torch.Tensor) -> SharedLayout:
    """The layout of (b, T) rows (prompt left-padded, the last ``resp_len`` columns the response) whose
    (b,) ``groups`` say which share their prompts' common prefix (its length found here)."""
    device = ids.device
    ids, real = ids.cpu(), attn.bool().cpu()  # the layout's indices are built on the host, moved once
    split = ids.shape[1] - resp_len
    prompt_cols = [torch.nonzero(real[i, :split]).flatten() for i in range(len(ids))]
    resp_cols = [torch.nonzero(real[i, split:]).flatten() + split for i in range(len(ids))]
    members: dict[int, list[int]] = {}
    for i, g in enumerate(groups.tolist()):
        members.setdefault(int(g), []).append(i)
    tokens: list[torch.Tensor] = []
    positions: list[torch.Tensor] = []
    q_lens: list[int] = []
    keys: list[torch.Tensor] = []
    resp_start, prompt_last = [0] * len(ids), [0] * len(ids)
    offset = 0
    for rows, k in _units(ids, prompt_cols, members):
        prefix = ids[rows[0], prompt_cols[rows[0]][:k]]  # (k,) the tokens every row of the unit starts with
        lo = offset
        tokens.append(prefix)
        positions.append(torch.arange(k))
        offset += k
        lone = len(rows) == 1  # one sequence, as without sharing
        if not lone:
            q_lens.append(k)
            keys.append(torch.arange(lo, lo + k))
        for i in rows:
            own = prompt_cols[i][k:]  # (s,) the row's prompt after the shared prefix
            s, r = len(own), len(resp_cols[i])
            prompt_last[i], resp_start[i] = (offset + s - 1 if s else lo + k - 1), offset + s
            if r == 0:  # nothing to predict: its own prompt tokens need not run
                continue
            tokens.append(ids[i, torch.cat([own, resp_cols[i]])])
            positions.append(torch.arange(k, k + s + r))
            q_lens.append(k + s + r if lone else s + r)
            keys.append(torch.arange(lo, offset + s + r) if lone else
                        torch.cat([torch.arange(lo, lo + k), torch.arange(offset, offset + s + r)]))
            offset += s + r
        if lone and len(resp_cols[rows[0]]) == 0:  # a lone row without a response: its prompt alone
            q_lens.append(k)
            keys.append(torch.arange(lo, lo + k))
    hidden, target = [], []
    for i in range(len(ids)):
        r = len(resp_cols[i])
        own = torch.arange(resp_start[i], resp_start[i] + r)  # (r,)
        target.append(own)
        hidden.append(torch.cat([torch.tensor([prompt_last[i]]), own[:-1]]) if r else own)
    k_lens = [len(k) for k in keys]
    return SharedLayout(
        flat_ids=torch.cat(tokens).to(device),
        positions=torch.cat(positions).to(device),
        cu_q=_starts(q_lens).to(device),
        cu_k=_starts(k_lens).to(device),
        max_q=max(q_lens, default=0),
        max_k=max(k_lens, default=0),
        kv_index=torch.cat(keys).to(device),
        hidden_index=torch.cat(hidden).to(device),
        target_index=torch.cat(target).to(device),
    )


def _units(ids: torch.Tensor, prompt_cols: list[torch.Tensor],
           members: dict[int, list[int]]) -> list[tuple[list[int], int]]:
    """Each group's rows with the length of the prefix their real prompts share (the whole prompt where
    they are identical, ``packing.prompt_groups``); a group whose prompts share no token, row by row."""
    units: list[tuple[list[int], int]] = []
    for rows in members.values():
        k = common_prefix_len([ids[i, prompt_cols[i]].numpy() for i in rows])
        if len(rows) > 1 and k == 0:
            units += [([i], len(prompt_cols[i])) for i in rows]
        else:
            units.append((rows, k))
    return units


def _starts(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0] + lengths).cumsum(0).to(torch.int32)


def shared_prefix_hidden(decoder: Any, ids: torch.Tensor, attn: torch.Tensor, resp_len: int,
                         groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, H) hidden states that predict the rows' response tokens and those (N,) tokens, row-major, as
    ``logprobs._packed_hidden`` gives them, with each group's prompt run once."""
    layout = shared_layout(ids, attn, resp_len, groups)
    # use_cache=False: with a cache object transformers would not read the packed layout
    out = decoder(input_ids=layout.flat_ids[None], position_ids=layout.positions[None], attention_mask=None,
                  use_cache=False, **layout.attention_kwargs())
    return out.last_hidden_state[0, layout.hidden_index], layout.flat_ids[layout.target_index]
