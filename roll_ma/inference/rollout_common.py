"""Request parsing and response packing shared by the hf and vllm rollout strategies.

Both backends read the same request columns (``prompt_ids``, ``agent_id``, optional
``sample_seed``), take the same sampling overrides (a ``GenerateRequest``) and return rows packed
the same way (see the STANDARD KEYS of ``roll_ma.protocol``), so that a pipeline can switch
backends without noticing. Only the part in the middle, turning prompts into tokens and
log-probs, differs.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from roll_ma.config.schema import ModelConfig, RolloutConfig
from roll_ma.inference import rollout_traits
from roll_ma.models.adapters import AgentSpec
from roll_ma.packing import left_pad, position_ids_from_mask, right_pad
from roll_ma.protocol import DataProto
from roll_ma.protocol.args import tensor_columns
from roll_ma.protocol.requests import GenerateRequest

SEED_MOD = 2**31 - 1  # per-row seeds stay positive int32, which every backend accepts


@dataclass(frozen=True)
class SamplingSettings:
    """Sampling of one generate call: the rollout config, overridden by its ``GenerateRequest``."""

    temperature: float
    top_p: float
    max_new_tokens: int
    stop: tuple[str, ...]
    greedy: bool
    seed: int | None

    @property
    def logprob_temperature(self) -> float:
        """Temperature of rollout_log_probs: the sampling one; 1.0 when greedy (logits / 0 is undefined)."""
        return 1.0 if self.greedy else self.temperature


def adapter_sync_dtype(rollout: RolloutConfig, model: ModelConfig) -> str | None:
    """The dtype adapters are exported in for the rollout: vLLM serves LoRA weights in the model's dtype
    (bf16/fp16 on GPU), so casting on the trainer's GPU halves what crosses to the engine and installs
    the very same numbers; None (keep fp32) for the hf backend and fp32 models."""
    lora_dtype = str(rollout.engine_kwargs.get("lora_dtype", "auto"))
    if model.dtype == "float32" or lora_dtype not in ("auto", model.dtype):
        return None
    if not rollout_traits(rollout.backend).adapters_in_model_dtype:
        return None
    return model.dtype


def sampling_settings(cfg: RolloutConfig, request: GenerateRequest) -> SamplingSettings:
    """The config's sampling defaults overridden by ``request``, each value checked."""
    temperature = cfg.temperature if request.temperature is None else float(request.temperature)
    top_p = cfg.top_p if request.top_p is None else float(request.top_p)
    max_new_tokens = cfg.max_new_tokens if request.max_new_tokens is None else int(request.max_new_tokens)
    stop = cfg.stop if request.stop is None else request.stop
    stop = [stop] if isinstance(stop, str) else list(stop)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if any(not isinstance(s, str) or not s for s in stop):
        raise ValueError(f"stop must be a list of non-empty strings, got {stop!r}")
    greedy = request.greedy or temperature == 0.0
    return SamplingSettings(
        temperature=1.0 if greedy else temperature,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        stop=tuple(stop),
        greedy=greedy,
        seed=None if request.seed is None else int(request.seed),
    )


def request_rows(data: DataProto, agents: Sequence[AgentSpec]) -> tuple[list[list[int]], list[str | None]]:
    """(prompt token ids per row, adapter name per row) of a generate request, validated."""
    for key in ("prompt_ids", "agent_id"):
        if key not in data.non_tensor:
            raise ValueError(
                f"generate: the request lacks non_tensor[{key!r}]; it has {list(data.non_tensor)}"
            )
    prompts = [[int(t) for t in p] for p in data.non_tensor["prompt_ids"]]
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"generate: row {i} has an empty prompt_ids")
    return prompts, adapters_of_rows(data, agents)


def adapters_of_rows(data: DataProto, agents: Sequence[AgentSpec]) -> list[str | None]:
    """The adapter name of each row's agent (``non_tensor['agent_id']``); None for every row of a rollout
    that serves no adapters (a teacher: the base model answers for every agent)."""
    if "agent_id" not in data.non_tensor:
        raise ValueError(f"the batch lacks non_tensor['agent_id']; it has {list(data.non_tensor)}")
    if not agents:
        return [None] * len(data)
    names: list[str | None] = []
    for agent_id in data.non_tensor["agent_id"]:
        a = int(agent_id)
        if not 0 <= a < len(agents):
            raise ValueError(
                f"agent_id {a} is out of range: the rollout serves {len(agents)} agents "
                f"({[s.name for s in agents]})"
            )
        names.append(agents[a].adapter)
    return names


def row_seeds(data: DataProto, settings: SamplingSettings, rng: np.random.Generator) -> list[int]:
    """One sampling seed per row.

    With a request's ``seed`` the seed of a row is a hash of (seed, ``sample_seed`` of the row),
    so it does not depend on which rollout worker gets the row or on the rows beside it; rows
    without ``sample_seed`` use their position in this call instead (which does depend on the
    split). Without a seed, seeds come from the strategy's own generator.
    """
    n = len(data)
    if settings.seed is None:
        return [int(s) for s in rng.integers(0, SEED_MOD, size=n)]
    per_row = data.non_tensor.get("sample_seed")
    keys = [int(s) for s in per_row] if per_row is not None else list(range(n))
    return [
        int(np.random.SeedSequence([settings.seed % 2**63, k % 2**63]).generate_state(1)[0]) % SEED_MOD
        for k in keys
    ]


def stop_cut(text: str, stops: Sequence[str]) -> int | None:
    """Position of the earliest stop string in ``text`` (None: no stop string in it)."""
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def stop_token_index(tokenizer: Any, ids: Sequence[int], stops: Sequence[str]) -> int | None:
    """Index of the token that completes the first stop string in ``decode(ids)`` (None: no stop string).

    Containment only grows with the prefix, so a binary search over prefixes finds it.
    """
    if not stops or stop_cut(tokenizer.decode(list(ids), skip_special_tokens=False), stops) is None:
        return None
    lo, hi = 0, len(ids) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if stop_cut(tokenizer.decode(list(ids[: mid + 1]), skip_special_tokens=False), stops) is None:
            lo = mid + 1
        else:
            hi = mid
    return lo


def response_text(tokenizer: Any, ids: Sequence[int], stops: Sequence[str]) -> str:
    """Decoded response without special tokens, cut before the first stop string.

    Both backends decode the same way (vLLM's incremental detokenizer would drop an incomplete
    UTF-8 tail that a full decode shows as U+FFFD).
    """
    text = tokenizer.decode(list(ids), skip_special_tokens=True)
    cut = stop_cut(text, stops) if stops else None
    return text if cut is None else text[:cut]


@dataclass
class RowResult:
    """One generated response before padding: its tokens (all in the mask) and what the engine reported."""

    token_ids: list[int]
    log_probs: list[float]
    text: str
    finish_reason: str  # "stop" (EOS or stop string) | "length"
    adapter_version: int


def pack_generation(
    data: DataProto, prompts: Sequence[Sequence[int]], rows: Sequence[RowResult], pad_id: int
) -> DataProto:
    """The request's columns plus the generated ones, padded to this call's longest prompt / response."""
    assert len(rows) == len(prompts) == len(data), "one result per request row"
    prompt_ids, prompt_mask = left_pad(prompts, pad_id)  # (B, P) each
    width = max(1, max(len(r.token_ids) for r in rows))
    responses = right_pad([r.token_ids for r in rows], pad_id, torch.long, width)  # (B, R)
    response_mask = right_pad([[1.0] * len(r.token_ids) for r in rows], 0.0, torch.float32, width)  # (B, R)
    log_probs = right_pad([r.log_probs for r in rows], 0.0, torch.float32, width)  # (B, R), 0 off the mask
    attention_mask = torch.cat([prompt_mask, response_mask.long()], dim=1)  # (B, T)
    tensors = tensor_columns(data.batch)
    tensors.update(
        prompts=prompt_ids,
        responses=responses,
        response_mask=response_mask,
        input_ids=torch.cat([prompt_ids, responses], dim=1),  # (B, T)
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),  # (B, T)
        rollout_log_probs=log_probs * response_mask,
    )
    non_tensor: dict[str, Sequence[Any] | np.ndarray] = dict(data.non_tensor)
    non_tensor.update(
        response_text=[r.text for r in rows],
        adapter_version=[int(r.adapter_version) for r in rows],
        finish_reason=[r.finish_reason for r in rows],
    )
    return DataProto.from_dict(tensors, non_tensor, {**copy.deepcopy(data.meta_info), "pad_id": pad_id})


def scoring_rows(data: DataProto) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt tokens, response tokens) per row of a packed batch: the tokens under the attention mask."""
    for key in ("prompts", "responses", "attention_mask", "response_mask"):
        if key not in data.batch.keys():
            raise ValueError(f"score: the batch lacks {key!r}; it has {list(data.batch.keys())}")
    prompts, responses = data.batch["prompts"], data.batch["responses"]  # (B, P), (B, R)
    p_len = prompts.shape[1]
    mask = data.batch["attention_mask"].bool()  # (B, T)
    out_p, out_r = [], []
    for i in range(len(data)):
        out_p.append(prompts[i][mask[i, :p_len]].tolist())
        out_r.append(responses[i][mask[i, p_len:]].tolist())
    return out_p, out_r


def pack_scores(data: DataProto, log_probs: torch.Tensor, versions: Sequence[int]) -> DataProto:
    """``rollout_log_probs`` (B, R), zero off the response mask, and the adapter version each row was scored
    with (``score_adapter_version``)."""
    masked = log_probs.float() * data.batch["response_mask"].float()  # (B, R)
    return DataProto.from_dict(
        {"rollout_log_probs": masked},
        {"score_adapter_version": [int(v) for v in versions]},
        copy.deepcopy(data.meta_info),
    )


def fallback_rng(seed: int) -> np.random.Generator:
    """Row seeds for requests that bring none: from the run seed and this worker's RANK (one stream each)."""
    return np.random.default_rng([int(seed) % 2**63, int(os.environ.get("RANK", "0"))])


def check_sleep_level(level: Any) -> None:
    if level == 2:
        raise ValueError(
            "sleep level 2 drops the weights and breaks LoRA reloading in vLLM (verl #3516); "
            "use rollout.sleep_level=1 or kv_cache"
        )
    if level not in (1, "kv_cache") or isinstance(level, bool):
        raise ValueError(f"sleep level must be 1 or 'kv_cache', got {level!r}")
