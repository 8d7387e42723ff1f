"""sft: each agent's adapter learns its own rows' responses by token NLL (the prompt never counts).

Rows are the standard layout (``input_ids``, ``attention_mask``, ``responses``, ``response_mask``,
``agent_id``), as the env workers and ``roll_ma.data.rows.sft_rows`` make them. Every response
token of a mini-batch weighs the same (TRL's SFTTrainer with a completion-only loss). Reported
per agent: ``sft_loss``, the mean token NLL of its rows before each step.
"""

from __future__ import annotations

import numpy as np
import torch

from roll_ma.algorithms.preference import sft_loss
from roll_ma.config.schema import AlgorithmConfig
from roll_ma.models.logprobs import response_log_probs
from roll_ma.protocol import DataProto
from roll_ma.strategies.micro_batches import real_lengths
from roll_ma.strategies.policy_updater import PolicyUpdate, PolicyUpdater, row_slots
from roll_ma.strategies.scoring import check_columns
from roll_ma.strategies.supervised_update import supervised_update

SFT_KEYS = ("input_ids", "attention_mask", "responses", "response_mask")


class SFTObjective:
    name = "sft"

    def check(self, data: DataProto, algo_cfg: AlgorithmConfig) -> None:
        check_columns(data, SFT_KEYS, "an sft train_step")

    def row_tokens(self, data: DataProto) -> np.ndarray:
        return data.batch["response_mask"].float().sum(-1).numpy()

    def update(
        self,
        updater: PolicyUpdater,
        rows: DataProto,
        agent_of_row: np.ndarray,
        agent_ids: list[int],
        step: int,
        temperature: float,
    ) -> PolicyUpdate:
        cols = {k: rows.batch[k] for k in SFT_KEYS}
        resp_len = cols["responses"].shape[1]
        prompt_lens, response_lens = real_lengths(cols["attention_mask"], resp_len)
        slots = row_slots(agent_of_row, agent_ids)
        dev = updater.device

        def micro_loss(idx: torch.Tensor, real: torch.Tensor, local_denom: float):
            mask = cols["response_mask"][idx].to(dev).float() * real.to(dev)[:, None]  # (b, R)
            log_probs, _ = response_log_probs(
                updater.engine,
                cols["input_ids"][idx].to(dev),
                cols["attention_mask"][idx].to(dev),
                resp_len,
                remove_padding=updater.batching.remove_padding,
                chunk_tokens=updater.batching.chunk_tokens,
            )
            loss, _ = sft_loss(log_probs, mask, float(local_denom[0]))
            sums = torch.zeros(len(agent_ids), 2, dtype=torch.float64)
            with torch.no_grad():
                for s in torch.unique(slots[idx][real > 0]).tolist():
                    agent_mask = mask * (slots[idx] == s).to(dev, mask.dtype)[:, None]
                    _, stats = sft_loss(log_probs.detach(), agent_mask)
                    sums[s] = torch.tensor([stats["nll_sum"], stats["tokens"]], dtype=torch.float64)
            return loss, sums

        counts = cols["response_mask"].float().sum(-1).numpy()
        result, sums = supervised_update(
            updater, len(rows), prompt_lens, response_lens, counts, micro_loss, len(agent_ids), 2
        )
        for s, agent_id in enumerate(agent_ids):
            nll, tokens = sums[s].tolist()
            result.agent_metrics[agent_id] = {"sft_loss": nll / tokens if tokens > 0 else 0.0}
        return result
