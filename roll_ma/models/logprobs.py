"""Per-token log-probs of the response part of (prompt + response) sequences.

Shared by the train worker (old and reference log-probs, the loss) and the hf rollout
backend (scoring), so that both compute the same numbers the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from roll_ma.packing import position_ids_from_mask


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] without materialising the full (B, R, V) log-softmax twice."""
    logits = logits.float()
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def response_log_probs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    **forward_kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, R) log pi(response token | prefix) and optionally (B, R) entropy.

    input_ids: (B, T) prompt left-padded + response right-padded; the response is the last
    ``response_len`` columns. Logits at t predict token t+1, hence the shift by one.
    """
    # columns that are left padding in every row change nothing (positions come from the mask): drop them.
    # Batches grouped by agent share short prompts, so this often halves the work.
    real_cols = attention_mask.bool().any(dim=0)
    first = int(real_cols.float().argmax()) if bool(real_cols.any()) else 0
    first = min(first, input_ids.shape[1] - response_len - 1)
    if first > 0:
        input_ids, attention_mask = input_ids[:, first:], attention_mask[:, first:]
    position_ids = position_ids_from_mask(attention_mask)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
        **forward_kwargs,
    )
    logits = out.logits[:, -response_len - 1 : -1, :]  # (B, R, V) predicts the response tokens
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, -response_len:]  # (B, R)
    log_probs = token_log_probs(logits, targets)
    entropy = entropy_from_logits(logits) if with_entropy else None
    return log_probs, entropy


def choice_log_probs(
    model: Any,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    choices: Sequence[Sequence[Sequence[int]]],
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, K) log pi(choice | prompt) of whole candidate answers, and the (B, K) mask of real choices.

    prompt_ids, prompt_mask: (B, P) left-padded prompts; ``choices[i]`` lists row i's candidate
    answers as token ids (rows may have different numbers of candidates). Every candidate is
    scored as its own sequence, in one forward: B x K rows.
    """
    flat = [(i, k, ids) for i, row in enumerate(choices) for k, ids in enumerate(row)]
    width = max((len(row) for row in choices), default=0)
    log_probs = torch.zeros(len(choices), width, device=prompt_ids.device)  # (B, K)
    mask = torch.zeros(len(choices), width, device=prompt_ids.device)  # (B, K)
    if not flat:
        return log_probs, mask
    length = max(len(ids) for _, _, ids in flat)
    answers = torch.zeros(len(flat), length, dtype=prompt_ids.dtype, device=prompt_ids.device)  # (N, L)
    answer_mask = torch.zeros(len(flat), length, dtype=prompt_mask.dtype, device=prompt_ids.device)
    for n, (_, _, ids) in enumerate(flat):
        answers[n, : len(ids)] = torch.as_tensor(list(ids), dtype=prompt_ids.dtype)
        answer_mask[n, : len(ids)] = 1
    row = torch.tensor([i for i, _, _ in flat], device=prompt_ids.device)  # (N,)
    col = torch.tensor([k for _, k, _ in flat], device=prompt_ids.device)  # (N,)
    token_lp, _ = response_log_probs(
        model,
        torch.cat([prompt_ids[row], answers], dim=1),
        torch.cat([prompt_mask[row], answer_mask], dim=1),
        length,
        temperature=temperature,
    )  # (N, L)
    log_probs = log_probs.index_put((row, col), (token_lp * answer_mask).sum(-1))
    mask[row, col] = 1.0
    return log_probs, mask
