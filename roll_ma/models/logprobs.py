"""Per-token log-probs of the response part of (prompt + response) sequences.

Shared by the train worker (old and reference log-probs, the loss) and the hf rollout
backend (scoring), so that both compute the same numbers the same way.

Memory follows tokens, not vocabulary x padding: for the architectures in ``SPLIT_HEAD_MODELS``
the decoder runs alone, the hidden states of the response tokens are picked out, and the LM
head, log-softmax and entropy run over them ``chunk_tokens`` at a time (each chunk recomputed
in the backward pass), so the (tokens, vocab) logits of a whole micro-batch never exist at
once. At 7B (vocab 152k) one 32-row x 1k-token micro-batch of full fp32 logits is 19 GiB; a
1024-token chunk is 0.6 GiB. Other architectures take the plain path (full logits).

With ``remove_padding`` the rows' real tokens are packed into one sequence whose position ids
restart at 0 for every row. Under ``roll_ma_varlen`` (``models/varlen_attention.py``, the default
of the train and reference models) or flash attention, the rows' boundaries go to the attention
(``cu_seq_lens_q``) and each row attends only to itself in one variable-length kernel; under
sdpa/eager transformers builds a block-diagonal mask over the whole packed length instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from roll_ma.models.shared_prefix import shared_prefix_hidden
from roll_ma.models.varlen_attention import NAME, PACKED_IMPLEMENTATIONS, packed_boundaries
from roll_ma.packing import position_ids_from_mask

# model_type of causal LMs whose logits are exactly lm_head(decoder(...)) (no soft-capping or
# logit scaling after the head), so the head may run on a subset of positions
SPLIT_HEAD_MODELS = frozenset({"qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "llama", "mistral", "phi3"})
DEFAULT_CHUNK_TOKENS = 1024


def token_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[target] without materialising the full (B, R, V) log-softmax twice."""
    logits = logits.float()
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def split_lm(model: Any) -> tuple[Any, Any] | None:
    """(decoder, lm_head) of a causal LM, through DeepSpeed and PEFT wrappers; None when the logits
    are not plain ``lm_head(hidden)`` or the parts cannot be found."""
    inner = getattr(model, "module", model)  # DeepSpeedEngine -> the wrapped model
    if hasattr(inner, "get_base_model"):  # PeftModel -> the transformers model (LoRA layers inside)
        inner = inner.get_base_model()
    config = getattr(inner, "config", None)
    if getattr(config, "model_type", None) not in SPLIT_HEAD_MODELS:
        return None
    get_decoder = getattr(inner, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else getattr(inner, "model", None)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    if decoder is None or head is None:
        return None
    return decoder, head


def _head_chunk(head: Any, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(n,) log pi(target) and (n,) entropy (zeros unless asked) from (n, H) hidden states."""
    logits = head(hidden).float()  # (n, V)
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)  # (n,)
    log_probs = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
    if with_entropy:  # H = logsumexp - E_p[logit]
        entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    else:
        entropy = torch.zeros_like(log_probs)
    return log_probs, entropy


def head_log_probs(head: Any, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                   with_entropy: bool = False, chunk_tokens: int = DEFAULT_CHUNK_TOKENS
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(N,) float32 log-probs and entropies of ``targets`` (N,) given their (N, H) hidden states.

    The head runs ``chunk_tokens`` rows at a time; with gradients on, each chunk is checkpointed
    (its logits are recomputed in the backward pass instead of being kept).
    """
    n = hidden.shape[0]
    step = n if chunk_tokens <= 0 else chunk_tokens
    outs = []
    for lo in range(0, n, max(step, 1)):
        h, t = hidden[lo:lo + step], targets[lo:lo + step]
        if torch.is_grad_enabled() and h.requires_grad:
            outs.append(checkpoint(_head_chunk, head, h, t, temperature, with_entropy, use_reentrant=False))
        else:
            outs.append(_head_chunk(head, h, t, temperature, with_entropy))
    if not outs:  # no response token: (0,) each, still on the graph when ``hidden`` is (so a micro-batch of
        # empty replies backpropagates zeros instead of giving DeepSpeed a loss with no grad_fn)
        empty = hidden.sum(-1, dtype=torch.float32)  # (0,)
        return empty, empty
    return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs])


def drop_padding_columns(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_len: int
                         ) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(B, T') ids, (B, T') mask without the columns that are padding in every row, and the response
    length r <= response_len left (the response stays the last r columns; the trailing cut ones were
    padding everywhere). Such columns change nothing, as positions come from the mask; batches grouped
    by agent share short prompts and lengths, so this often halves a forward's work."""
    real_cols = attention_mask.bool().any(dim=0)  # (T,)
    first = int(real_cols.float().argmax()) if bool(real_cols.any()) else 0
    first = min(first, input_ids.shape[1] - response_len - 1)
    tail_real = real_cols[input_ids.shape[1] - response_len:]  # (R,)
    keep_r = int(tail_real.nonzero().max()) + 1 if bool(tail_real.any()) else 1
    end = input_ids.shape[1] - (response_len - keep_r)
    return input_ids[:, first:end], attention_mask[:, first:end], keep_r


def response_log_probs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_len: int,
    temperature: float = 1.0,
    with_entropy: bool = False,
    remove_padding: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    prompt_groups: torch.Tensor | None = None,
    **forward_kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(B, R) log pi(response token | prefix) and optionally (B, R) entropy; 0 off the response.

    input_ids, attention_mask: (B, T) prompt left-padded + response right-padded; the response
    is the last ``response_len`` columns, its tokens those under the attention mask (each row's
    prompt has at least one). Logits at t predict token t+1, hence the shift by one.
    ``forward_kwargs`` (e.g. PEFT's per-row ``adapter_names``) need the whole model's forward: the
    plain path. ``prompt_groups`` ((B,), ``packing.prompt_groups``; packed rows under ``roll_ma_varlen``):
    rows of one group run the prompt prefix they share once (``models/shared_prefix.py``), with the same
    numbers.
    """
    ids, attn, keep_r = drop_padding_columns(input_ids, attention_mask, response_len)
    cut = response_len - keep_r  # trailing all-padding response columns
    parts = None if forward_kwargs else split_lm(model)
    if parts is None:
        log_probs, entropy = _full_logits_log_probs(model, ids, attn, keep_r, temperature, with_entropy,
                                                    **forward_kwargs)
    else:
        decoder, head = parts
        resp = attn[:, -keep_r:].bool()  # (B, r) real response tokens
        shared = prompt_groups is not None and getattr(decoder.config, "_attn_implementation", None) == NAME
        if remove_padding and shared:
            assert prompt_groups is not None  # for mypy: shared says so
            hidden, targets = shared_prefix_hidden(decoder, ids, attn, keep_r, prompt_groups)
        elif remove_padding:
            hidden, targets = _packed_hidden(decoder, ids, attn, keep_r)
        else:
            out = decoder(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn),
                          use_cache=False)
            hidden = out.last_hidden_state[:, -keep_r - 1:-1][resp]  # (N, H) predicts each response token
            targets = ids[:, -keep_r:][resp]  # (N,)
        lp, ent = head_log_probs(head, hidden, targets, temperature, with_entropy, chunk_tokens)
        log_probs = lp.new_zeros(resp.shape).masked_scatter(resp, lp)  # (B, r)
        entropy = ent.new_zeros(resp.shape).masked_scatter(resp, ent) if with_entropy else None
    if cut:
        log_probs = torch.nn.functional.pad(log_probs, (0, cut))
        entropy = torch.nn.functional.pad(entropy, (0, cut)) if entropy is not None else None
    return log_probs, entropy


def _packed_hidden(decoder: Any, ids: torch.Tensor, attn: torch.Tensor, resp_len: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows' real tokens as ONE sequence (positions restart per row): (N, H) hidden states that
    predict the response tokens, and those (N,) tokens, in row-major order."""
    real = attn.bool()  # (B, T)
    flat_ids = ids[real]  # (L,) every row's real tokens, one row after another
    positions = position_ids_from_mask(attn)[real]  # (L,) 0.. within each row
    boundaries = {}
    if getattr(decoder.config, "_attn_implementation", None) in PACKED_IMPLEMENTATIONS:
        cu, longest = packed_boundaries(positions)  # (N + 1,) row starts: one varlen kernel per layer
        boundaries = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest,
                      "max_length_k": longest}
    # use_cache=False: with a cache object transformers would not read the packed layout
    out = decoder(input_ids=flat_ids[None], position_ids=positions[None], attention_mask=None,
                  use_cache=False, **boundaries)
    flat_index = real.flatten().long().cumsum(0).view(real.shape) - 1  # (B, T) index in the packed sequence
    resp = real[:, -resp_len:]  # (B, r)
    target_index = flat_index[:, -resp_len:][resp]  # (N,)
    # the token before a row's first response token is that row's last prompt token (never padding)
    return out.last_hidden_state[0, target_index - 1], flat_ids[target_index]


def _full_logits_log_probs(model: Any, ids: torch.Tensor, attn: torch.Tensor, resp_len: int,
                           temperature: float, with_entropy: bool, **forward_kwargs: Any
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The plain path (any architecture): the model's whole (B, T, V) logits."""
    out = model(input_ids=ids, attention_mask=attn, position_ids=position_ids_from_mask(attn),
                use_cache=False, **forward_kwargs)
    logits = out.logits[:, -resp_len - 1:-1, :]  # (B, r, V) predicts the response tokens
    if temperature != 1.0:
        logits = logits / temperature
    resp = attn[:, -resp_len:].float()  # (B, r)
    log_probs = token_log_probs(logits, ids[:, -resp_len:]) * resp
    entropy = entropy_from_logits(logits) * resp if with_entropy else None
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
