"""Plain helpers of the train-side tests (batches of rows, on-policy scoring, snapshots)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from roll_ma.config.schema import (
    AgentConfig,
    AlgorithmConfig,
    CriticConfig,
    LoraConfig,
    ModelConfig,
    StudyConfig,
    TrainConfig,
)
from roll_ma.protocol import DataProto
from roll_ma.workers.worker_specs import TrainWorkerSpec

PROMPT_LEN, RESPONSE_LEN, VOCAB = 6, 5, 512
LORA = LoraConfig(rank=4, alpha=8.0, dropout=0.0)  # small, and no dropout: runs are deterministic


def make_batch(agent_ids: Sequence[int], seed: int = 0, advantage: float | Sequence[float] | None = None,
               prompt_len: int = PROMPT_LEN, response_len: int = RESPONSE_LEN) -> DataProto:
    """Rows with left-padded prompts and right-padded responses of random lengths (>= 1 token each)."""
    gen = torch.Generator().manual_seed(seed)
    n = len(agent_ids)
    p_lens = torch.randint(2, prompt_len + 1, (n,), generator=gen)
    r_lens = torch.randint(1, response_len + 1, (n,), generator=gen)
    prompts = torch.zeros(n, prompt_len, dtype=torch.long)
    responses = torch.zeros(n, response_len, dtype=torch.long)
    p_mask = torch.zeros(n, prompt_len, dtype=torch.long)
    r_mask = torch.zeros(n, response_len, dtype=torch.long)
    for i in range(n):
        p, r = int(p_lens[i]), int(r_lens[i])
        prompts[i, prompt_len - p:] = torch.randint(3, VOCAB, (p,), generator=gen)
        p_mask[i, prompt_len - p:] = 1
        responses[i, :r] = torch.randint(3, VOCAB, (r,), generator=gen)
        r_mask[i, :r] = 1
    if advantage is None:
        adv = torch.randn(n, generator=gen)
    else:
        adv = torch.as_tensor(advantage, dtype=torch.float32).expand(n).clone()
    attention = torch.cat([p_mask, r_mask], dim=1)
    tensors = {
        "prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention, "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "response_mask": r_mask.float(), "advantages": adv[:, None] * r_mask.float(),
        "old_log_probs": torch.zeros(n, response_len),
    }
    return DataProto.from_dict(tensors, {"agent_id": [int(a) for a in agent_ids]})


def on_policy(strategy: Any, batch: DataProto, ref: bool = False) -> DataProto:
    """The batch with old_log_probs (and ref_log_probs) scored by ``strategy`` now."""
    batch = batch.select()
    batch.batch["old_log_probs"] = strategy.compute_log_probs(batch).batch["old_log_probs"]
    if ref:
        ref = strategy.compute_log_probs(batch, adapters_enabled=False)
        batch.batch["ref_log_probs"] = ref.batch["ref_log_probs"]
    return batch


def snapshot(strategy: Any) -> dict[str, dict[str, torch.Tensor]]:
    return strategy.adapter_tensors()


def all_finite(metrics: dict[str, float]) -> bool:
    return all(np.isfinite(v) for v in metrics.values())


def learning_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """A train_step's metrics without the wall-clock ones (``timing/...``), for equality checks."""
    return {k: v for k, v in metrics.items() if not k.startswith("timing/")}


def make_group_batch(agents: int = 2, groups: int = 2, samples: int = 4, seed: int = 0,
                     prompt_len: int = 9, response_len: int = 7, branch_tokens: int = 0) -> DataProto:
    """GRPO-shaped rows: per agent ``groups`` prompts, each answered ``samples`` times with replies of
    different lengths (rows of one group share their prompt tokens; agents' prompts differ), rows of
    the agents and groups interleaved as a rollout gathers them. ``branch_tokens``: each row's prompt
    goes on with 1..branch_tokens tokens of its own (samples that branch from one history, as a later
    turn's prompt carrying each sample's earlier reply), and the rows say their ``group_id``."""
    from roll_ma.packing import pack_sequences

    gen = torch.Generator().manual_seed(seed)
    prompts = [[torch.randint(3, VOCAB, (int(torch.randint(2, prompt_len + 1, (1,), generator=gen)),),
                              generator=gen).tolist() for _ in range(groups)] for _ in range(agents)]
    rows = [(a, g) for _ in range(samples) for g in range(groups) for a in range(agents)]
    replies = [torch.randint(3, VOCAB, (int(torch.randint(1, response_len + 1, (1,), generator=gen)),),
                             generator=gen).tolist() for _ in rows]
    own = [torch.randint(3, VOCAB, (int(torch.randint(1, branch_tokens + 1, (1,), generator=gen)),),
                         generator=gen).tolist() if branch_tokens else [] for _ in rows]
    tensors = pack_sequences([prompts[a][g] + mine for (a, g), mine in zip(rows, own)], replies, 0,
                             prompt_len + branch_tokens, response_len)
    adv = torch.randn(len(rows), generator=gen)
    tensors.update(advantages=adv[:, None] * tensors["response_mask"],
                   old_log_probs=torch.zeros(len(rows), response_len))
    meta = {"step": 0, "temperature": 1.0}
    non_tensor: dict = {"agent_id": [a for a, _ in rows]}
    if branch_tokens:
        non_tensor["group_id"] = [f"{a}/{g}" for a, g in rows]
    return DataProto.from_dict(tensors, non_tensor, meta)


def worker_spec(model: ModelConfig, agents: Sequence[AgentConfig], **settings: Any) -> TrainWorkerSpec:
    """A train worker's spec for a test: ``model`` and ``agents``, the suite's small LoRA, every other block
    at its schema default unless ``settings`` names it (``train=TrainConfig(...)``, ``seed=3``, ...)."""
    defaults: dict[str, Any] = {"lora": LORA, "train": TrainConfig(), "algorithm": AlgorithmConfig(),
                                "critic": CriticConfig(), "study": StudyConfig(), "loss_terms": (), "seed": 0,
                                "reference_copies": False}
    return TrainWorkerSpec.from_settings({**defaults, "model": model, "agents": agents, **settings})


def same_optimizer_state(a: dict, b: dict) -> bool:
    """Two ``optimizer_state`` dicts hold the same Adam moments and step counts, bit for bit."""
    for key in ("exp_avg", "exp_avg_sq", "step"):
        if len(a[key]) != len(b[key]):
            return False
        if not all(torch.equal(x, y) for x, y in zip(a[key], b[key], strict=True)):
            return False
    return a["global_steps"] == b["global_steps"] and a["scheduler_steps"] == b["scheduler_steps"]
