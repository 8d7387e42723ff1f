"""dpo: each agent's adapter learns from its own (prompt, chosen, rejected) triplets.

The loss is ``algorithms.preference.dpo_loss`` (sigmoid, optional label smoothing), plus, with
``rpo_alpha`` > 0, ``rpo_alpha`` times the token NLL of the chosen responses (RPO, Pang et al. 2024;
TRL's ``rpo_alpha``): it keeps the chosen answers likely while the margin grows.

A row is one pair (``roll_ma.data.rows.pair_rows``): ``chosen_*`` and ``rejected_*`` versions of the
standard columns (same prompt, both padded to common widths), the reference's sequence log-probs
``ref_chosen_logps`` / ``ref_rejected_logps`` (N,), computed before the update
(``compute_pair_ref_log_probs``: the frozen copy of the agent's adapter, or the base), and
``agent_id``. ``UpdateRequest.dpo`` holds ``beta``, ``label_smoothing`` and ``rpo_alpha``. Chosen and
rejected run through the model in one forward (2b rows), as TRL's concatenated forward does.

Reported per agent, averaged over its pairs (TRL's names): ``dpo_loss``, ``rewards/chosen``,
``rewards/rejected``, ``rewards/margins``, ``rewards/accuracies``, ``logps/chosen``, ``logps/rejected``,
and ``nll_loss`` (per chosen token) when ``rpo_alpha`` > 0.
"""

from __future__ import annotations

import numpy as np
import torch

from roll_ma.algorithms.preference import dpo_loss, sequence_log_probs, sft_loss
from roll_ma.config.schema import AlgorithmConfig
from roll_ma.models.logprobs import response_log_probs
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import DPOSettings
from roll_ma.training.agent_sums import AgentSums, row_slots
from roll_ma.training.micro_batches import real_lengths
from roll_ma.training.policy_engine import PolicyEngine
from roll_ma.training.scoring import check_columns
from roll_ma.training.update_loop import PolicyUpdate, UpdateContext, UpdatePlan, run_update

SIDES = ("chosen", "rejected")
ROW_KEYS = ("input_ids", "attention_mask", "responses", "response_mask")
PAIR_KEYS = tuple(f"{side}_{k}" for side in SIDES for k in ROW_KEYS)
REF_KEYS = ("ref_chosen_logps", "ref_rejected_logps")
STATS = (
    "loss",
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)


def side(data: DataProto, name: str) -> DataProto:
    """The chosen or rejected responses of pair rows as standard rows (for scoring)."""
    return DataProto.from_dict(
        {k: data.batch[f"{name}_{k}"] for k in ROW_KEYS}, dict(data.non_tensor), dict(data.meta_info)
    )


def dpo_settings(ctx: UpdateContext) -> DPOSettings:
    """The dpo update's loss settings (``UpdateRequest.dpo``, which a dpo request cannot lack)."""
    if ctx.dpo is None:
        raise ValueError("a dpo train_step needs UpdateRequest(objective='dpo', dpo=DPOSettings(beta=...))")
    return ctx.dpo


class DPOLoss:
    """The ``MicroBatchLoss`` of DPO (+ RPO's NLL). counts: (N, 2) 1 per pair, chosen response tokens."""

    sum_fields: tuple[str, ...] = (*STATS, "nll_sum", "chosen_tokens", "pairs")

    def __init__(self, engine: PolicyEngine, rows: DataProto, agent_of_row: np.ndarray, agent_ids: list[int],
                 settings: DPOSettings):
        self.engine = engine
        self.beta, self.smoothing = settings.beta, settings.label_smoothing
        self.rpo_alpha = settings.rpo_alpha
        self.cols = {k: rows.batch[k] for k in PAIR_KEYS + REF_KEYS}
        self.resp_len = self.cols["chosen_responses"].shape[1]
        p_len, c_len = real_lengths(self.cols["chosen_attention_mask"], self.resp_len)
        _, r_len = real_lengths(self.cols["rejected_attention_mask"], self.resp_len)
        # a micro-batch of b pairs runs 2b rows: the planner counts both
        self.prompt_lens, self.response_lens = 2 * p_len, 2 * np.maximum(c_len, r_len)
        self.slots = row_slots(agent_of_row, agent_ids)  # (N,)
        self.counts = np.stack([np.ones(len(rows)), c_len.astype(np.float64)], axis=1)  # (N, 2)

    def _both(self, key: str, idx: torch.Tensor) -> torch.Tensor:
        """(2b, ...) the chosen rows, then the rejected ones."""
        return torch.cat([self.cols[f"chosen_{key}"][idx], self.cols[f"rejected_{key}"][idx]]).to(
            self.engine.device
        )

    def micro_loss(
        self, idx: torch.Tensor, real: torch.Tensor, local_denoms: np.ndarray, sums: AgentSums
    ) -> torch.Tensor:
        cols, dev, batching = self.cols, self.engine.device, self.engine.batching
        b = len(idx)
        mask = self._both("response_mask", idx).float()  # (2b, R)
        log_probs, _ = response_log_probs(
            self.engine.engine,
            self._both("input_ids", idx),
            self._both("attention_mask", idx),
            self.resp_len,
            remove_padding=batching.remove_padding,
            chunk_tokens=batching.chunk_tokens,
        )  # (2b, R)
        seq = sequence_log_probs(log_probs, mask)  # (2b,)
        loss, stats = dpo_loss(
            seq[:b],
            seq[b:],
            cols["ref_chosen_logps"][idx].to(dev).float(),
            cols["ref_rejected_logps"][idx].to(dev).float(),
            self.beta,
            self.smoothing,
            float(local_denoms[0]),
        )
        nll, _ = sft_loss(log_probs[:b], mask[:b], float(local_denoms[1]))  # per chosen token
        if self.rpo_alpha > 0:
            loss = loss + self.rpo_alpha * nll
        weight = real.to(dev)  # (b,) 0 on the placeholder row of an empty micro-batch
        if float(weight.sum()) == 0:
            loss = loss * 0.0  # same graph (every rank runs as many backwards), no weight
        with torch.no_grad():
            slots = self.slots[idx]
            for s in torch.unique(slots[real > 0]).tolist():
                mine = (slots == s).to(dev) & (weight > 0)  # (b,)
                chosen_mask = mask[:b] * mine[:, None]
                _, nll_stats = sft_loss(log_probs[:b].detach(), chosen_mask)
                sums.add(
                    s,
                    {
                        **{k: float(stats[k][mine].sum()) for k in STATS},
                        "nll_sum": nll_stats["nll_sum"],
                        "chosen_tokens": nll_stats["tokens"],
                        "pairs": float(mine.sum()),
                    },
                )
        return loss

    def agent_metrics(self, sums: AgentSums, slot: int) -> dict[str, float]:
        """TRL's names, averaged over the agent's pairs; ``nll_loss`` per chosen token (RPO on)."""
        t = sums.row(slot)
        pairs = t["pairs"]
        metrics = {("dpo_loss" if k == "loss" else k): (t[k] / pairs if pairs > 0 else 0.0) for k in STATS}
        metrics["pairs"] = pairs
        if self.rpo_alpha > 0:
            metrics["nll_loss"] = t["nll_sum"] / t["chosen_tokens"] if t["chosen_tokens"] > 0 else 0.0
        return metrics


class DPOObjective:
    """dpo as a ``TrainObjective``."""

    name = "dpo"
    trains_critic = False

    def check(self, data: DataProto, algo_cfg: AlgorithmConfig) -> None:
        check_columns(data, PAIR_KEYS, "a dpo train_step")
        missing = [k for k in REF_KEYS if k not in data.batch.keys()]
        if missing:
            raise ValueError(
                f"a dpo train_step needs the reference's log-probs {missing}; compute them "
                "with compute_pair_ref_log_probs before the update"
            )

    def row_tokens(self, data: DataProto) -> np.ndarray:
        return sum(data.batch[f"{s}_response_mask"].float().sum(-1) for s in SIDES).numpy()

    def update(
        self,
        engine: PolicyEngine,
        rows: DataProto,
        agent_of_row: np.ndarray,
        agent_ids: list[int],
        ctx: UpdateContext,
    ) -> PolicyUpdate:
        loss = DPOLoss(engine, rows, agent_of_row, agent_ids, dpo_settings(ctx))
        plan = UpdatePlan(np.arange(len(rows)), loss.prompt_lens, loss.response_lens, len(agent_ids))
        result, sums = run_update(engine, loss, plan, ctx.step)
        for s, agent_id in enumerate(agent_ids):
            result.agent_metrics[agent_id] = loss.agent_metrics(sums, s)
        return result
