"""sft: each agent's adapter learns its own rows' responses by token NLL (the prompt never counts).

Rows are the standard layout (``input_ids``, ``attention_mask``, ``responses``, ``response_mask``,
``agent_id``), as the env workers and ``roll_ma.data.rows.sft_rows`` make them. Every response
token of a mini-batch weighs the same (TRL's SFTTrainer with a completion-only loss). Reported
per agent: ``sft_loss``, the mean token NLL of its rows before each step. One pass over the rows in
the driver's order (it shuffles), ``train.mini_batch_size`` rows per optimizer step.
"""

from __future__ import annotations

import numpy as np
import torch

from roll_ma.algorithms.preference import sft_loss
from roll_ma.config.schema import AlgorithmConfig
from roll_ma.models.logprobs import response_log_probs
from roll_ma.protocol import DataProto
from roll_ma.training.agent_sums import AgentSums, row_slots
from roll_ma.training.micro_batches import real_lengths
from roll_ma.training.policy_engine import PolicyEngine
from roll_ma.training.scoring import check_columns
from roll_ma.training.update_loop import PolicyUpdate, UpdateContext, UpdatePlan, run_update

SFT_KEYS = ("input_ids", "attention_mask", "responses", "response_mask")


class SFTLoss:
    """The ``MicroBatchLoss`` of SFT: token NLL of the responses. counts: (N,) response tokens."""

    sum_fields: tuple[str, ...] = ("nll_sum", "tokens")

    def __init__(self, engine: PolicyEngine, rows: DataProto, agent_of_row: np.ndarray, agent_ids: list[int]):
        self.engine = engine
        self.cols = {k: rows.batch[k] for k in SFT_KEYS}
        self.slots = row_slots(agent_of_row, agent_ids)  # (N,)
        self.counts = self.cols["response_mask"].float().sum(-1).numpy()  # (N,) float32

    def micro_loss(
        self, idx: torch.Tensor, real: torch.Tensor, local_denoms: np.ndarray, sums: AgentSums
    ) -> torch.Tensor:
        cols, dev, batching = self.cols, self.engine.device, self.engine.batching
        mask = cols["response_mask"][idx].to(dev).float() * real.to(dev)[:, None]  # (b, R)
        log_probs, _ = response_log_probs(
            self.engine.engine,
            cols["input_ids"][idx].to(dev),
            cols["attention_mask"][idx].to(dev),
            cols["responses"].shape[1],
            remove_padding=batching.remove_padding,
            chunk_tokens=batching.chunk_tokens,
        )  # (b, R)
        loss, _ = sft_loss(log_probs, mask, float(local_denoms[0]))
        with torch.no_grad():
            slots = self.slots[idx]
            for s in torch.unique(slots[real > 0]).tolist():
                agent_mask = mask * (slots == s).to(dev, mask.dtype)[:, None]  # (b, R)
                _, stats = sft_loss(log_probs.detach(), agent_mask)
                sums.add(s, {"nll_sum": stats["nll_sum"], "tokens": stats["tokens"]})
        return loss


class SFTObjective:
    """sft as a ``TrainObjective``."""

    name = "sft"
    trains_critic = False

    def check(self, data: DataProto, algo_cfg: AlgorithmConfig) -> None:
        check_columns(data, SFT_KEYS, "an sft train_step")

    def row_tokens(self, data: DataProto) -> np.ndarray:
        return data.batch["response_mask"].float().sum(-1).numpy()

    def update(
        self,
        engine: PolicyEngine,
        rows: DataProto,
        agent_of_row: np.ndarray,
        agent_ids: list[int],
        ctx: UpdateContext,
    ) -> PolicyUpdate:
        loss = SFTLoss(engine, rows, agent_of_row, agent_ids)
        prompt_lens, response_lens = real_lengths(
            rows.batch["attention_mask"], rows.batch["responses"].shape[1]
        )
        plan = UpdatePlan(np.arange(len(rows)), prompt_lens, response_lens, len(agent_ids))
        result, sums = run_update(engine, loss, plan, ctx.step)
        for s, agent_id in enumerate(agent_ids):
            t = sums.row(s)
            result.agent_metrics[agent_id] = {
                "sft_loss": t["nll_sum"] / t["tokens"] if t["tokens"] > 0 else 0.0
            }
        return result
