"""Per-step metrics from a batch of turns and its episode summaries."""

from __future__ import annotations

import resource
import sys
from collections import defaultdict
from typing import Any

import numpy as np

from roll_ma.config.schema import RunConfig
from roll_ma.models.flops import ModelShape, forward_flops
from roll_ma.packing import batch_prompt_groups, repeated_prompts, shared_prefix_lens
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import UpdateResult


def _masked_mean(values: Any, mask: Any) -> float:
    denom = float(mask.sum())
    return float((values * mask).sum()) / denom if denom > 0 else 0.0


def rollout_metrics(
    batch: DataProto, episodes: list[dict], agent_names: list[str], expected_versions: dict[int, int]
) -> dict[str, float]:
    """agent/<name>/{reward, turns, response_len, format_error_rate, adapter_version, ...}, rollout/..."""
    out: dict[str, float] = {"rollout/episodes": float(len(episodes)), "rollout/turns": float(len(batch))}
    if episodes:
        out["rollout/episode_turns"] = float(np.mean([e["turns"] for e in episodes]))
        out["rollout/truncated_episodes"] = float(sum(e["truncated"] for e in episodes))
        returns = np.array(
            [e["returns"] for e in episodes if len(e["returns"]) == len(episodes[0]["returns"])]
        )
        for seat, value in enumerate(returns.mean(axis=0) if len(returns) else []):
            out[f"rollout/return_seat{seat}"] = float(value)
    if len(batch) == 0:
        return out
    scores = batch.batch["scores"].numpy()
    lengths = batch.batch["response_mask"].sum(-1).numpy()
    agent_ids = batch.non_tensor["agent_id"].astype(int)
    versions = batch.non_tensor["adapter_version"].astype(int)
    errors = batch.non_tensor["format_error"].astype(bool)
    stale_total = 0
    for aid, name in enumerate(agent_names):
        rows = agent_ids == aid
        if not rows.any():
            continue
        p = f"agent/{name}/"
        stale = int((versions[rows] != expected_versions.get(aid, -1)).sum())
        stale_total += stale
        out.update(
            {
                p + "reward": float(scores[rows].mean()),
                p + "turns": float(rows.sum()),
                p + "response_len": float(lengths[rows].mean()),
                p + "format_error_rate": float(errors[rows].mean()),
                p + "adapter_version": float(versions[rows].max()),
                p + "stale_rows": float(stale),
            }
        )
    out["rollout/stale_rows"] = float(stale_total)
    out["rollout/prompt_truncated"] = float(batch.non_tensor["prompt_truncated"].astype(bool).sum())
    out["rollout/response_tokens"] = float(lengths.sum())
    return out


def logprob_gap_metrics(batch: DataProto, agent_names: list[str]) -> dict[str, float]:
    """Trainer-vs-rollout log-prob gap per agent: ~0 when the rollout used the trainer's adapters."""
    gap = (batch.batch["old_log_probs"] - batch.batch["rollout_log_probs"]).abs()
    mask = batch.batch["response_mask"]
    agent_ids = batch.non_tensor["agent_id"].astype(int)
    out = {}
    for aid, name in enumerate(agent_names):
        rows = agent_ids == aid
        if rows.any():
            out[f"agent/{name}/logprob_gap"] = _masked_mean(gap[rows], mask[rows])
            out[f"agent/{name}/logprob_gap_max"] = float((gap[rows] * mask[rows]).max())
    return out


def forward_flops_of(batch: DataProto, shape: ModelShape, rows: np.ndarray | None = None,
                     shared_prompts: bool = False) -> float:
    """Model FLOPs of one forward over the batch's rows (all, or the (B,) bool ``rows``). ``shared_prompts``:
    the pass runs each prompt group's shared prefix once (``train.share_prompt_prefix``), so the FLOPs it
    runs are fewer by the prefix's forward for every repeat of it (attention to the prefix is unchanged)."""
    attention = batch.batch["attention_mask"]  # (B, T)
    response = batch.batch["response_mask"]  # (B, R)
    row_tokens, response_tokens = attention.sum(-1).numpy(), response.sum(-1).numpy()
    selected = np.ones(len(row_tokens), dtype=bool) if rows is None else np.asarray(rows, dtype=bool)
    total = forward_flops(shape, row_tokens[selected], response_tokens[selected])
    if shared_prompts and selected.any():
        width = response.shape[1]
        groups = batch_prompt_groups(batch, width)  # (B,)
        shared = shared_prefix_lens(batch.batch["input_ids"], attention, width, groups)[selected]  # (n,)
        repeats = repeated_prompts(groups[selected])  # (n,) the prefixes the pass does not run again
        total -= forward_flops(shape, shared[repeats], np.zeros(int(repeats.sum())))
    return total


def mfu_metrics(flops: dict[str, float], seconds: dict[str, float], gpus: dict[str, int],
                peak_flops: float) -> dict[str, float]:
    """``system/tflops_per_gpu/<pass>`` and, on a GPU the peak table knows, ``system/mfu/<pass>``: model
    FLOPs of each pass (``models/flops.py``) over its seconds, per GPU of the workers that ran it."""
    out = {}
    for name, work in flops.items():
        took = seconds.get(name, 0.0)
        if work <= 0 or took <= 0:
            continue
        per_gpu = work / took / max(gpus.get(name, 1), 1)
        out[f"system/tflops_per_gpu/{name}"] = per_gpu / 1e12
        if peak_flops > 0:
            out[f"system/mfu/{name}"] = per_gpu / peak_flops
    return out


def update_mfu_metrics(cfg: RunConfig, batch: DataProto, update: UpdateResult, times: dict[str, float],
                       shape: ModelShape, gpus: dict[str, int], peak_flops: float,
                       shared_prompts: bool = False) -> dict[str, float]:
    """MFU of the agents' update: a LoRA update is two forwards' work (forward + backward to the
    activations, ``models/flops.py``; full fine-tuning three) over the rows of the agents that took a
    step (``update.stepped_agents``; each group's prompt once with ``shared_prompts``); the critic's own
    update (``timing/value_critic_update``) is not in the seconds."""
    rows = np.isin(batch.non_tensor["agent_id"].astype(int), list(update.stepped_agents))
    seconds = times.get("timing/update", 0.0) - update.metrics.get("timing/value_critic_update", 0.0)
    passes = 3.0 if cfg.train.full_finetune else 2.0  # full fine-tuning also computes weight gradients
    work = passes * forward_flops_of(batch, shape, rows, shared_prompts)
    return mfu_metrics({"update": work}, {"update": seconds}, gpus, peak_flops)


def episode_env_metrics(episodes: list[dict], prefix: str) -> dict[str, float]:
    """Means of the envs' own per-episode metrics (math correctness, game scores, ...)."""
    sums: dict[str, list[float]] = defaultdict(list)
    for e in episodes:
        for k, v in e["metrics"].items():
            if isinstance(v, (int, float)):
                sums[k].append(float(v))
    return {f"{prefix}/{k}": float(np.mean(v)) for k, v in sums.items()}


def system_metrics() -> dict[str, float]:
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = {"system/driver_max_rss_gb": rss_kb / (1024**2 if sys.platform != "darwin" else 1024**3)}
    try:
        import torch

        if torch.cuda.is_available():
            out["system/driver_gpu_mem_gb"] = torch.cuda.max_memory_allocated() / 1024**3
    except ImportError:
        pass
    return out
