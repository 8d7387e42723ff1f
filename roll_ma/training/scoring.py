"""Response log-probs of a batch in micro-batches, without gradients.

Shared by the train strategies (old log-probs, reference log-probs with adapters disabled)
and the reference worker, so both reference paths run the very same computation.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from roll_ma.models.logprobs import response_log_probs
from roll_ma.packing import batch_prompt_groups, shared_lengths, shared_prefix_lens
from roll_ma.protocol import DataProto
from roll_ma.training.micro_batches import MicroBatching, real_lengths

SCORING_KEYS = ("input_ids", "attention_mask", "responses")


def check_columns(data: DataProto, keys: tuple[str, ...] | list[str], who: str) -> None:
    missing = [k for k in keys if k not in data.batch.keys()]
    if missing:
        raise ValueError(f"{who}: the batch lacks {missing}; it has {list(data.batch.keys())}")


def row_prompt_groups(data: DataProto, batching: MicroBatching) -> np.ndarray | None:
    """(B,) prompt group of each row (``packing.prompt_groups``: rows of different agents never share; the
    rows' GRPO ``group_id`` lets samples that branch from one history share its prefix) when ``batching``
    shares prompts, else None."""
    if not (batching.share_prefix and batching.remove_padding) or len(data) == 0:
        return None
    return batch_prompt_groups(data, data.batch["responses"].shape[1])


def budget_lengths(data: DataProto, groups: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(B,) x 2 token counts a budget packs the rows by: real prompt and response tokens, or with shared
    prompts each row's shared prefix and the rest (``packing.shared_lengths``)."""
    width = data.batch["responses"].shape[1]
    prompt_lens, response_lens = real_lengths(data.batch["attention_mask"], width)
    if groups is None:
        return prompt_lens, response_lens
    shared = shared_prefix_lens(data.batch["input_ids"], data.batch["attention_mask"], width, groups)
    return shared_lengths(prompt_lens, response_lens, shared)


@torch.no_grad()
def score_rows(
    model: Any,
    data: DataProto,
    batching: MicroBatching | int,
    device: torch.device,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, R) float32 CPU log pi(response token) and optionally (B, R) entropy, in micro-batches.

    ``batching``: how rows are grouped (a plain int: that many rows per micro-batch). The caller
    picks the model state (eval mode, active adapter, ``disable_adapter()``).
    """
    check_columns(data, SCORING_KEYS, "scoring")
    if isinstance(batching, int):
        if batching < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {batching}")
        batching = MicroBatching(max_rows=batching)
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")
    n, resp_len = data.batch["responses"].shape
    log_probs = torch.zeros(n, resp_len, dtype=torch.float32)  # (B, R)
    entropy = torch.zeros(n, resp_len, dtype=torch.float32) if with_entropy else None  # (B, R)
    groups = row_prompt_groups(data, batching)  # (B,) or None: rows of one group run their prefix once
    prompt_lens, response_lens = budget_lengths(data, groups)  # (B,) each
    for rows in batching.split(np.arange(n), prompt_lens, response_lens, groups):
        sel = torch.from_numpy(rows)
        ids = data.batch["input_ids"][sel].to(device)  # (b, T)
        mask = data.batch["attention_mask"][sel].to(device)  # (b, T)
        shared = torch.from_numpy(groups[rows]) if groups is not None else None  # (b,)
        lp, ent = response_log_probs(model, ids, mask, resp_len, temperature=temperature,
                                     with_entropy=with_entropy, remove_padding=batching.remove_padding,
                                     chunk_tokens=batching.chunk_tokens, prompt_groups=shared)
        log_probs[sel] = lp.float().cpu()
        if entropy is not None:
            assert ent is not None  # asked for with_entropy
            entropy[sel] = ent.float().cpu()
    return log_probs, entropy


def score_groups(model: Any, weights: Any, data: DataProto, groups: dict[str | None, np.ndarray],
                 batching: MicroBatching, device: torch.device, temperature: float = 1.0,
                 with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, R) float32 log-probs (and entropy when asked) of every row, each group of row positions under
    its scorer (``weights.scoring``: an adapter's name, or None: every adapter off)."""
    n, resp_len = data.batch["responses"].shape
    log_probs = torch.zeros(n, resp_len, dtype=torch.float32)  # (B, R)
    entropy = torch.zeros(n, resp_len, dtype=torch.float32) if with_entropy else None  # (B, R)
    for name, idx in groups.items():
        rows = data.select_idxs(idx)
        with weights.scoring(name):
            lp, ent = score_rows(model, rows, batching, device, temperature, with_entropy)
        log_probs[torch.from_numpy(idx)] = lp
        if entropy is not None:
            assert ent is not None  # asked for with_entropy
            entropy[torch.from_numpy(idx)] = ent
    return log_probs, entropy


def log_prob_columns(model: Any, weights: Any, data: DataProto, by_policy: dict[str, np.ndarray] | None,
                     batching: MicroBatching, device: torch.device, temperature: float = 1.0,
                     with_entropy: bool = False) -> DataProto:
    """(B, R) float32 ``old_log_probs``, each row under its policy (``by_policy``: row positions per
    adapter) or, with ``by_policy`` None, ``ref_log_probs`` from the base weights (every adapter off); plus
    ``entropy`` when asked. Eval mode, no grad."""
    key = "old_log_probs" if by_policy is not None else "ref_log_probs"
    check_columns(data, ("input_ids", "attention_mask", "responses"), f"compute {key}")
    model.eval()
    weights.activate(None)
    groups: dict[str | None, np.ndarray] = {None: np.arange(len(data))}  # None: every adapter off
    if by_policy is not None:
        groups = {name: idx for name, idx in by_policy.items()}
    log_probs, entropy = score_groups(model, weights, data, groups, batching, device, temperature,
                                      with_entropy)
    tensors = {key: log_probs, **({"entropy": entropy} if entropy is not None else {})}
    return DataProto.from_dict(tensors, meta_info=data.meta_info)
