"""ppo: the RL loop's policy-gradient objective over one policy's rows.

The policy loss is the one ``algorithm.policy_loss`` names (``algorithms/algorithm_registry.py``; default
``ppo_clip``), plus the KL to the reference (``kl_mode: loss``), the entropy bonus and the extra terms a
study adds (``UpdateContext.loss_terms``: ``LossTerm``, e.g. ``studies/action_entropy.py``). Rows from older
adapters (``rollout.max_staleness`` > 0) are trained with the decoupled objective: the clip against pi_old
(proximal), each token weighted by pi_old / pi_behaviour. Without ``old_log_probs`` pi_old is this update's
own forward, detached (``pipelines/rl/on_policy.py``): exact only for one optimizer step on fresh rows.

Reported per agent: ``policy_loss``, ``entropy``, ``clip_frac``, ``kl`` (with a reference), each extra
term's own, ``is_weight_{mean,max,truncated}`` (decoupled), ``logprob_gap{,_max}`` (reused pi_old with the
engine's log-probs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from roll_ma.algorithms.algorithm_registry import POLICY_LOSSES, PolicyLoss
from roll_ma.algorithms.losses import aggregate, behavior_weights, entropy_coef_at, kl_estimate
from roll_ma.config.schema import AlgorithmConfig
from roll_ma.models.logprobs import response_log_probs
from roll_ma.packing import shared_prompt_tokens
from roll_ma.protocol import DataProto
from roll_ma.training.agent_sums import AgentSums, row_slots
from roll_ma.training.policy_engine import PolicyEngine
from roll_ma.training.scoring import budget_lengths, check_columns, row_prompt_groups
from roll_ma.training.update_loop import (
    LossTerm,
    PolicyUpdate,
    TermPart,
    UpdateContext,
    UpdatePlan,
    run_update,
)

TRAIN_KEYS = ("input_ids", "attention_mask", "responses", "response_mask", "advantages")
# per-agent sums over micro-batches, epochs and ranks; tokens: this agent's response tokens, units: the
# loss's unit (tokens, or rows with loss_agg=seq_mean); input_tokens: its rows' prompt + response tokens,
# input_tokens_run: those the forward ran (each micro-batch's shared prompts once)
PPO_SUMS = (
    "policy_loss",
    "kl",
    "entropy",
    "clipped",
    "tokens",
    "units",
    "is_weight",
    "is_truncated",
    "logprob_gap",
    "input_tokens",
    "input_tokens_run",
)
PPO_MAXIMA = ("is_weight", "logprob_gap")  # decoupled: largest weight; reused pi_old: largest |gap|


@dataclass
class _MicroBatch:
    """One micro-batch as the loss and the metrics read it: the forward's outputs and the terms they share."""

    idx: torch.Tensor  # (b,) the rows
    real: torch.Tensor  # (b,) 1 for a real row, 0 for padding
    mask: torch.Tensor  # (b, R) response tokens of real rows
    adv: torch.Tensor  # (b, R)
    log_probs: torch.Tensor  # (b, R) this forward's
    entropy: torch.Tensor  # (b, R)
    old: torch.Tensor  # (b, R) pi_old
    weights: torch.Tensor | None  # (b, R) decoupled: pi_old / pi_behaviour, capped
    truncated: torch.Tensor | None  # (b, R) decoupled: where the cap cut the weight
    gap: torch.Tensor | None  # (b, R) reused pi_old: |pi_old - engine's log-prob|
    kl: torch.Tensor | None = None  # (b, R) with a reference


class PPOLoss:
    """The ``MicroBatchLoss`` of one PPO update over ``rows``.

    counts: (N, 2 + terms) response tokens (the skip test), the loss's unit per ``loss_agg`` (tokens or 1
    per row), then each extra term's own denominator (``LossTerm.counts``).
    """

    def __init__(
        self,
        engine: PolicyEngine,
        rows: DataProto,
        agent_of_row: np.ndarray,
        agent_ids: list[int],
        ctx: UpdateContext,
    ):
        algo = ctx.algo_cfg
        self.engine, self.algo, self.temperature = engine, algo, ctx.temperature
        self.policy_loss: PolicyLoss = POLICY_LOSSES.get(algo.policy_loss)
        present = set(rows.batch.keys())
        n = len(rows)
        mini = min(engine.train_cfg.mini_batch_size or n, n)
        # rows from older adapters (rollout.max_staleness > 0): the decoupled objective needs the engine's
        # behaviour log-probs next to the proximal ones (old_log_probs)
        self.decoupled = ctx.behavior_correction
        reuse_old = "old_log_probs" not in present
        if reuse_old and (engine.train_cfg.ppo_epochs > 1 or mini < n or self.decoupled):
            raise ValueError(
                f"policy {engine.name!r}: the rows carry no old_log_probs, which only a step of "
                "one optimizer step on fresh rows can do without (ppo_epochs 1, one mini-batch, "
                "max_staleness 0); score them first (compute_log_probs)"
            )
        if self.decoupled and "rollout_log_probs" not in present:
            raise ValueError(
                "the decoupled objective (rollout.max_staleness > 0) needs the rows' "
                "rollout_log_probs (rollout.log_probs=true)"
            )
        keys = list(TRAIN_KEYS) + [k for k in ("old_log_probs", "ref_log_probs") if k in present]
        if self.decoupled or (reuse_old and "rollout_log_probs" in present):  # the weights, or the gap metric
            keys.append("rollout_log_probs")
        self.cols = {k: rows.batch[k] for k in keys}
        self.gap_metric = reuse_old and "rollout_log_probs" in self.cols
        self.row_slot = row_slots(agent_of_row, agent_ids)  # (N,)
        self.maxima = AgentSums(PPO_MAXIMA, len(agent_ids), reduce="max")
        self.entropy_coef = entropy_coef_at(algo.entropy_coef, algo.entropy_decay_steps, ctx.step)
        # a study's extra terms, those on at this step
        terms = (make(engine, rows, ctx) for make in ctx.loss_terms)
        self.terms: list[LossTerm] = [t for t in terms if t is not None]
        self.sum_fields = PPO_SUMS + tuple(f for t in self.terms for f in t.sum_fields)
        assert len(set(self.sum_fields)) == len(self.sum_fields), self.sum_fields
        tokens = self.cols["response_mask"].float().sum(-1).numpy().astype(np.float64)  # (N,)
        units = tokens if algo.loss_agg == "token_mean" else np.ones(n)
        self.counts = np.stack([tokens, units] + [t.counts.astype(np.float64) for t in self.terms], axis=1)
        self.groups = row_prompt_groups(rows, engine.batching)  # (N,) or None: each group's prefix once
        # (N,) x 2 what a token budget counts: real prompt and response tokens, or with shared prompts each
        # row's shared prefix and the rest (they add up to the same row)
        self.prompt_lens, self.response_lens = budget_lengths(rows, self.groups)

    def micro_loss(
        self, idx: torch.Tensor, real: torch.Tensor, local_denoms: np.ndarray, sums: AgentSums
    ) -> torch.Tensor:
        m = self._forward(idx, real)
        loss = self._loss(m, float(local_denoms[1]))
        parts: list[TermPart | None] = []  # each extra term's share (None: it sits this micro-batch out)
        for k, term in enumerate(self.terms):  # after the forward above (a term's own forward comes next)
            denom = float(local_denoms[2 + k])  # 0: the mini-batch has nothing of this term
            part = term.micro_loss(idx, real, denom) if denom > 0 else None
            if part is not None:
                loss = loss + part.loss
            parts.append(part)
        with torch.no_grad():
            slots = self.row_slot[idx]
            for s in torch.unique(slots[real > 0]).tolist():
                sums.add(s, self._agent_sums(m, s, slots) | self._term_sums(parts, slots == s))
        return loss

    def _forward(self, idx: torch.Tensor, real: torch.Tensor) -> _MicroBatch:
        """The micro-batch's rows on the device, this policy's forward over them, pi_old and (decoupled) the
        behaviour weights or (reused pi_old) the trainer-vs-engine gap."""
        algo, dev, cols = self.algo, self.engine.device, self.cols
        ids = cols["input_ids"][idx].to(dev)  # (b, T)
        attn = cols["attention_mask"][idx].to(dev)  # (b, T)
        mask = cols["response_mask"][idx].to(dev).float() * real.to(dev)[:, None]  # (b, R) pad rows count 0
        adv = cols["advantages"][idx].to(dev).float()  # (b, R)
        log_probs, entropy = response_log_probs(
            self.engine.engine,
            ids,
            attn,
            mask.shape[1],
            temperature=self.temperature,
            with_entropy=True,
            remove_padding=self.engine.batching.remove_padding,
            chunk_tokens=self.engine.batching.chunk_tokens,
            prompt_groups=torch.from_numpy(self.groups[idx.numpy()]) if self.groups is not None else None,
        )  # (b, R) each
        assert entropy is not None  # with_entropy=True
        # (b, R) pi_old: scored before the update, or (one optimizer step on fresh rows) this very forward
        old = cols["old_log_probs"][idx].to(dev).float() if "old_log_probs" in cols else log_probs.detach()
        weights = truncated = gap = None
        if self.decoupled:  # clip against pi_old (proximal), weight pi_old / pi_behav
            behav = cols["rollout_log_probs"][idx].to(dev).float()  # (b, R)
            weights, truncated = behavior_weights(old, behav, algo.is_weight_cap)  # (b, R) each
        elif "rollout_log_probs" in cols:  # reused pi_old: the trainer-vs-engine gap comes from here
            gap = (old - cols["rollout_log_probs"][idx].to(dev).float()).abs()  # (b, R)
        return _MicroBatch(idx, real, mask, adv, log_probs, entropy, old, weights, truncated, gap)

    def _loss(self, m: _MicroBatch, local_denom: float) -> torch.Tensor:
        """The policy loss plus the KL (``kl_mode: loss``), minus the entropy bonus; keeps the KL on ``m`` for
        the metrics."""
        algo, dev, cols, idx, mask = self.algo, self.engine.device, self.cols, m.idx, m.mask
        loss, _ = self.policy_loss(m.log_probs, m.old, m.adv, mask, algo, local_denom, m.weights)
        if "ref_log_probs" in cols:
            ref = cols["ref_log_probs"][idx].to(dev).float()  # (b, R)
            m.kl = kl_estimate(m.log_probs, ref, algo.kl_estimator)  # (b, R)
            if algo.kl_coef > 0 and algo.kl_mode == "loss":
                loss = loss + algo.kl_coef * aggregate(m.kl, mask, algo.loss_agg, local_denom)
        if self.entropy_coef > 0:
            loss = loss - self.entropy_coef * aggregate(m.entropy, mask, algo.loss_agg, local_denom)
        return loss

    def _agent_sums(self, m: _MicroBatch, s: int, slots: torch.Tensor) -> dict[str, float]:
        """Agent slot ``s``'s sums over this micro-batch (``PPO_SUMS``); raises its ``PPO_MAXIMA``."""
        algo, dev, mask, real = self.algo, self.engine.device, m.mask, m.real
        weights, truncated, gap = m.weights, m.truncated, m.gap
        lp, ent = m.log_probs.detach(), m.entropy.detach()
        agent_mask = mask * (slots == s).to(dev, mask.dtype)[:, None]  # (b, R) this agent's tokens
        # denominator 1: sums, divided by the agent's total count after all micro-batches and ranks
        pl, stats = self.policy_loss(lp, m.old, m.adv, agent_mask, algo, 1.0, weights)
        is_w = is_trunc = 0.0
        if weights is not None and truncated is not None:
            is_w = float((weights * agent_mask).sum())
            is_trunc = float((truncated.to(agent_mask.dtype) * agent_mask).sum())
            if agent_mask.any():
                self.maxima.raise_to(s, "is_weight", float(weights[agent_mask > 0].max()))
        gap_sum = 0.0
        if gap is not None and agent_mask.any():
            gap_sum = float((gap * agent_mask).sum())
            self.maxima.raise_to(s, "logprob_gap", float((gap * agent_mask).max()))
        toks = float(agent_mask.sum())
        inputs, inputs_run = self._input_tokens(m.idx, (slots == s) & (real > 0))
        units = toks if algo.loss_agg == "token_mean" else float(((slots == s) & (real > 0)).sum())
        kl_sum = 0.0 if m.kl is None else float(aggregate(m.kl.detach(), agent_mask, algo.loss_agg, 1.0))
        ent_sum = float(aggregate(ent, agent_mask, algo.loss_agg, 1.0))
        return {
            "policy_loss": float(pl),
            "kl": kl_sum,
            "entropy": ent_sum,
            "clipped": stats.get("clip_frac", 0.0) * toks,
            "tokens": toks,
            "units": units,
            "is_weight": is_w,
            "is_truncated": is_trunc,
            "logprob_gap": gap_sum,
            "input_tokens": inputs,
            "input_tokens_run": inputs_run,
        }

    def _input_tokens(self, idx: torch.Tensor, keep: torch.Tensor) -> tuple[float, float]:
        """Prompt + response tokens of rows ``idx[keep]`` ((b,) bool) and those the forward ran: each
        group's shared prefix once when prompts are shared (groups never cross agents: per agent is exact)."""
        rows = idx[keep.cpu()].numpy()
        p, r = self.prompt_lens[rows], self.response_lens[rows]
        total = float(p.sum() + r.sum())
        saved = shared_prompt_tokens(p, self.groups[rows]) if self.groups is not None else 0
        return total, total - saved

    def _term_sums(self, parts: list[TermPart | None], of_agent: torch.Tensor) -> dict[str, float]:
        """One agent's sums of each extra term over this micro-batch (``of_agent``: (b,) bool, its rows);
        zeros where a term added nothing."""
        out: dict[str, float] = {}
        for term, part in zip(self.terms, parts, strict=True):
            if part is None:
                out.update(dict.fromkeys(term.sum_fields, 0.0))
                continue
            for name, per_row in part.row_sums.items():  # (b,) each
                out[name] = float((per_row * of_agent.to(per_row.device, per_row.dtype)).sum())
        return out

    def agent_metrics(self, sums: AgentSums, maxima: AgentSums, slot: int) -> dict[str, float]:
        """One agent's metrics from the update's all-reduced sums and maxima."""
        t, top = sums.row(slot), maxima.row(slot)
        units, toks = t["units"], t["tokens"]
        metrics = {
            "policy_loss": t["policy_loss"] / units if units > 0 else 0.0,
            "entropy": t["entropy"] / units if units > 0 else 0.0,
            "clip_frac": t["clipped"] / toks if toks > 0 else 0.0,
        }
        if "ref_log_probs" in self.cols:
            metrics["kl"] = t["kl"] / units if units > 0 else 0.0
        for term in self.terms:
            metrics.update(term.agent_metrics({f: t[f] for f in term.sum_fields}))
        if self.decoupled and toks > 0:  # per response token of this agent
            metrics.update(
                is_weight_mean=t["is_weight"] / toks,
                is_weight_max=top["is_weight"],
                is_weight_truncated=t["is_truncated"] / toks,
            )
        if self.gap_metric and toks > 0:  # trainer vs engine on the rows' own adapter (was the pi_old pass's)
            metrics.update(logprob_gap=t["logprob_gap"] / toks, logprob_gap_max=top["logprob_gap"])
        metrics.update(input_tokens=t["input_tokens"], input_tokens_run=t["input_tokens_run"])
        return metrics


class PPOObjective:
    """The RL loop's ``TrainObjective``: PPO epochs x mini-batches x micro-batches over a policy's rows
    (the FULL batch on every rank; each rank trains on its share of every mini-batch)."""

    name = "ppo"
    trains_critic = True

    def check(self, data: DataProto, algo_cfg: AlgorithmConfig) -> None:
        check_columns(data, TRAIN_KEYS, "train_step")
        kl_in_loss = algo_cfg.kl_coef > 0 and algo_cfg.kl_mode == "loss"
        if kl_in_loss and "ref_log_probs" not in data.batch.keys():
            raise ValueError(
                "algorithm.kl_coef > 0 with kl_mode=loss needs ref_log_probs in the batch; "
                "compute them with the reference (compute_ref_log_probs) before train_step"
            )

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
        loss = PPOLoss(engine, rows, agent_of_row, agent_ids, ctx)
        plan = UpdatePlan(
            np.arange(len(rows)),
            loss.prompt_lens,
            loss.response_lens,
            len(agent_ids),
            epochs=engine.train_cfg.ppo_epochs,
            shuffle=True,
            progress=f"update {engine.name}, step {ctx.step}",
            keep_train_mode=True,
            groups=loss.groups,
        )
        result, sums = run_update(engine, loss, plan, ctx.step)
        maxima = loss.maxima.reduced(engine.device)
        for s, agent_id in enumerate(agent_ids):
            result.agent_metrics[agent_id] = loss.agent_metrics(sums, maxima, s)
        return result
