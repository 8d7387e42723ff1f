"""One policy's optimizer and PPO update: a DeepSpeed engine over exactly that policy's parameters.

A policy is one LoRA adapter (shared by the agents that name it) or, in full fine-tuning,
all base weights. Every policy gets its own engine on the one shared model, and each
engine's optimizer holds only its policy's parameters: DeepSpeed's optimizer does not follow
``requires_grad`` changes after ``initialize`` (STACK.md), so this is what keeps one agent's
update from touching another agent's weights, Adam moments or step count at ZeRO 0-2.

Gradient accumulation is driven here, not by DeepSpeed's counter: the config says
``gradient_accumulation_steps=1``, every micro-batch sets the boundary flag itself
(``set_gradient_accumulation_boundary(last)``), backward runs with ``scale_wrt_gas=False``,
and the loss is already normalised by the mini-batch's global token count, so a
mini-batch may have any number of micro-batches and takes exactly one optimizer step.
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from roll_ma.algorithms.losses import (
    aggregate,
    behavior_weights,
    choice_entropy,
    entropy_coef_at,
    kl_estimate,
    ppo_clip_loss,
)
from roll_ma.config.schema import AlgorithmConfig, StudyConfig, TrainConfig
from roll_ma.distributed.progress import progress_bar
from roll_ma.models.logprobs import choice_log_probs, response_log_probs
from roll_ma.protocol import DataProto
from roll_ma.strategies.ds_utils import all_reduce_max, all_reduce_sum, deepspeed_config, setup_deepspeed
from roll_ma.strategies.lr_schedule import make_lr_scheduler
from roll_ma.strategies.micro_batches import MicroBatching, real_lengths

TRAIN_KEYS = ("input_ids", "attention_mask", "responses", "response_mask", "advantages")
# per-agent sums gathered over micro-batches, epochs and ranks
_SUMS = ("policy_loss", "kl", "entropy", "clipped", "tokens", "units", "action_entropy", "choice_rows",
         "is_weight", "is_truncated", "logprob_gap")


def row_slots(agent_of_row: np.ndarray, agent_ids: list[int]) -> torch.Tensor:
    """(N,) the position of each row's agent in ``agent_ids`` (its slot in the per-agent sums)."""
    slot_of = {a: s for s, a in enumerate(agent_ids)}
    return torch.tensor([slot_of[int(a)] for a in agent_of_row], dtype=torch.long)


@dataclass
class _ActionBonus:
    """The action entropy bonus of one update: its weight at this step and each row's legal answers."""

    coef: float
    choices: list[list[list[int]]]  # per row: token ids of each legal action's answer
    has_choice: np.ndarray  # (N,) float32: 1 where a row has two or more legal actions

    @classmethod
    def of(cls, rows: DataProto, coef: float) -> _ActionBonus | None:
        if coef <= 0:
            return None
        if "action_choices" not in rows.non_tensor:
            raise ValueError("study.action_entropy_coef > 0 but the rows carry no 'action_choices' "
                             "(env workers fill them for games when the bonus is on)")
        choices = [list(c) for c in rows.non_tensor["action_choices"]]
        has_choice = np.array([len(c) >= 2 for c in choices], dtype=np.float32)
        return cls(coef, choices, has_choice)


@dataclass
class PolicyUpdate:
    """What one policy's update did: per-agent metrics (agent id -> name -> value) and optimizer facts."""

    agent_metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    optimizer_steps: int = 0
    grad_norm: float = 0.0
    lr: float = 0.0
    skipped_nonfinite: int = 0  # optimizer steps skipped because the gradient overflowed


class PolicyUpdater:
    """The DeepSpeed engine of one policy and the PPO loop over that policy's rows.

    Args:
        name: policy name (the adapter name, or "full" in full fine-tuning).
        index: position of the policy in config order (seeds its mini-batch shuffling).
        model: the shared model (a PeftModel holding every adapter, or the base model).
        params: this policy's parameters; the optimizer holds these and nothing else.
        activate: makes this policy the one that runs and trains (adapter + requires_grad).
        lr: peak learning rate of this policy.
        study_cfg: game-study helpers (``action_entropy_coef``: the entropy bonus over legal actions).
    """

    def __init__(self, name: str, index: int, model: Any, params: list[torch.nn.Parameter],
                 activate: Callable[[], None], lr: float, train_cfg: TrainConfig, algo_cfg: AlgorithmConfig,
                 seed: int, rank: int, world_size: int, device: torch.device, total_steps: int | None = None,
                 study_cfg: StudyConfig | None = None):
        if not params:
            raise ValueError(f"policy {name!r} has no parameters to train")
        self.name, self.index, self.seed = name, index, seed
        self.rank, self.world_size, self.device = rank, world_size, device
        self.train_cfg, self.algo_cfg = train_cfg, algo_cfg
        self.study_cfg = study_cfg or StudyConfig()
        self.activate = activate
        self.params = params
        deepspeed = setup_deepspeed(rank, world_size)
        activate()  # ZeRO keeps only the parameters that require grad when the engine is built
        bf16 = any(p.dtype == torch.bfloat16 for p in params)  # LoRA weights stay fp32 on a bf16 base (PEFT)
        config = deepspeed_config(train_cfg, lr=lr, bf16=bf16,
                                  trainable_elements=sum(p.numel() for p in params))
        self.engine, *_ = deepspeed.initialize(
            model=model, model_parameters=params, config=config,
            lr_scheduler=lambda opt: make_lr_scheduler(opt, train_cfg.lr_schedule, train_cfg.warmup_steps,
                                                       total_steps))
        self.zero_stage = int(train_cfg.zero_stage)
        if self.zero_stage == 0 and world_size == 1:
            # one rank has nothing to average, and DeepSpeed's fallback allreduce walks every parameter of
            # the shared model at every optimizer step of every agent (host time, the GPU idle)
            self.engine.enable_backward_allreduce = False
        self.batching = MicroBatching.for_training(train_cfg)
        self._fresh_schedule = copy.deepcopy(self.engine.lr_scheduler.state_dict())

    # ------------------------------------------------------------------ facts
    @property
    def current_lr(self) -> float:
        return float(self.engine.get_lr()[0])

    def optimizer_state(self) -> dict[str, Any]:
        """CPU copies of Adam's moments and step counts (per optimizer tensor), plus the engine's counters."""
        opt = self.engine.basic_optimizer  # ZeRO: the torch AdamW over this rank's flat fp32 partition
        state: dict[str, Any] = {"exp_avg": [], "exp_avg_sq": [], "step": []}
        for group in opt.param_groups:
            for p in group["params"]:
                for key, value in opt.state.get(p, {}).items():
                    if key in state:
                        state[key].append(torch.as_tensor(value).detach().to("cpu").clone())
        state["global_steps"] = int(self.engine.global_steps)
        state["scheduler_steps"] = int(self.engine.lr_scheduler.last_epoch)
        state["lr"] = self.current_lr
        return state

    # ------------------------------------------------------------------ the update
    def update(self, rows: DataProto, agent_of_row: np.ndarray, agent_ids: list[int], step: int,
               temperature: float = 1.0) -> PolicyUpdate:
        """PPO epochs x mini-batches x micro-batches over this policy's rows (the FULL batch on every rank).

        Each rank trains on its share of every mini-batch (``MicroBatching.rank_plan``: by rows, or
        by a token budget), and all ranks run the same number of micro-batches (ZeRO-2 reduces
        inside every backward).
        """
        cfg, algo = self.train_cfg, self.algo_cfg
        n = len(rows)
        present = set(rows.batch.keys())
        mini = min(cfg.mini_batch_size or n, n)
        # rows from older adapters (rollout.max_staleness > 0): the decoupled objective needs the engine's
        # behaviour log-probs next to the proximal ones (old_log_probs)
        decoupled = bool(rows.meta_info.get("behavior_correction", False))
        # no old_log_probs: pi_old is this update's own forward, detached (pipelines/on_policy.py), exact
        # only while every micro-batch runs on the weights that generated the rows
        reuse_old = "old_log_probs" not in present
        if reuse_old and (cfg.ppo_epochs > 1 or mini < n or decoupled):
            raise ValueError(f"policy {self.name!r}: the rows carry no old_log_probs, which only a step of "
                             "one optimizer step on fresh rows can do without (ppo_epochs 1, one mini-batch, "
                             "max_staleness 0); score them first (compute_log_probs)")
        if decoupled and "rollout_log_probs" not in present:
            raise ValueError("the decoupled objective (rollout.max_staleness > 0) needs the rows' "
                             "rollout_log_probs (rollout.log_probs=true)")
        keys = list(TRAIN_KEYS) + [k for k in ("old_log_probs", "ref_log_probs") if k in present]
        if decoupled or (reuse_old and "rollout_log_probs" in present):  # the weights, or the gap metric
            keys.append("rollout_log_probs")
        cols = {k: rows.batch[k] for k in keys}
        row_tokens = cols["response_mask"].float().sum(-1)  # (N,)
        # (N,) real prompt and response tokens of each row: what a token budget counts
        prompt_lens, response_lens = real_lengths(cols["attention_mask"], cols["responses"].shape[1])
        row_slot = row_slots(agent_of_row, agent_ids)  # (N,)
        sums = torch.zeros(len(agent_ids), len(_SUMS), dtype=torch.float64)
        self._is_max = torch.zeros(len(agent_ids), dtype=torch.float64)  # decoupled: largest weight per agent
        self._gap_max = torch.zeros(len(agent_ids), dtype=torch.float64)  # reused pi_old: largest |gap|
        norms: list[float] = []
        nonfinite = 0
        lr = self.current_lr
        entropy_coef = entropy_coef_at(algo.entropy_coef, algo.entropy_decay_steps, step)
        action_coef = entropy_coef_at(self.study_cfg.action_entropy_coef, algo.entropy_decay_steps, step)
        bonus = _ActionBonus.of(rows, action_coef)  # None while off

        self.activate()
        if not self.engine.module.training:  # the next agents' updates skip a walk over every module
            self.engine.train()
        # one bar per policy, from rank 0 only (every rank runs the same steps)
        # every rank reports its progress (a sign of life to the watchdog); rank 0 alone draws the bar
        bar = progress_bar(f"update {self.name}, step {step}", cfg.ppo_epochs * math.ceil(n / mini), "batch",
                           draw=self.rank == 0)
        for epoch in range(cfg.ppo_epochs):
            # shuffle only when mini-batches are a real subset; the same permutation on every rank
            order = (np.arange(n) if mini >= n
                     else np.random.default_rng([self.seed, step, epoch, self.index]).permutation(n))
            for start in range(0, n, mini):
                batch_idx = order[start:start + mini]
                tokens = float(row_tokens[batch_idx].sum())
                bar.update()
                if tokens == 0:
                    continue  # no signal; an Adam step on zero gradients would still move by momentum
                denom = tokens if algo.loss_agg == "token_mean" else float(len(batch_idx))
                # DeepSpeed averages gradients over ranks: each rank's sum / (global count / world size)
                local_denom = denom / self.world_size
                # the action bonus is a mean over decisions (rows with a choice), whatever loss_agg is
                choice_denom = (float(bonus.has_choice[batch_idx].sum()) / self.world_size
                                if bonus is not None else 0.0)
                micro = self.batching.rank_plan(batch_idx, prompt_lens, response_lens, self.rank,
                                                self.world_size)

                def micro_loss(idx: torch.Tensor, real: torch.Tensor, local_denom: float = local_denom,
                               choice_denom: float = choice_denom) -> torch.Tensor:
                    nonlocal sums
                    loss, micro_sums = self._micro_loss(
                        cols, idx, real, row_slot, local_denom, temperature, len(agent_ids), entropy_coef,
                        bonus, choice_denom, decoupled)
                    sums += micro_sums
                    return loss

                lr = self.current_lr  # the lr this step uses (the scheduler advances inside step())
                norm, stepped = self.step_micro_batches(micro, batch_idx, micro_loss)
                nonfinite += int(not stepped)
                norms.append(norm)

        bar.close()
        sums = all_reduce_sum(sums, self.device)
        is_max = all_reduce_max(self._is_max, self.device)
        gap_max = all_reduce_max(self._gap_max, self.device)
        gap_metric = reuse_old and "rollout_log_probs" in cols
        mean_norm = float(np.mean(norms)) if norms else 0.0
        result = PolicyUpdate(optimizer_steps=len(norms) - nonfinite, grad_norm=mean_norm, lr=lr,
                              skipped_nonfinite=nonfinite)
        has_ref = "ref_log_probs" in cols
        for s, agent_id in enumerate(agent_ids):
            pl, kl, ent, clipped, toks, units, action_ent, choice_rows, is_w, is_trunc, gap = sums[s].tolist()
            metrics = {
                "policy_loss": pl / units if units > 0 else 0.0,
                "entropy": ent / units if units > 0 else 0.0,
                "clip_frac": clipped / toks if toks > 0 else 0.0,
            }
            if has_ref:
                metrics["kl"] = kl / units if units > 0 else 0.0
            if choice_rows > 0:  # only while the action bonus is on (it costs a forward per action)
                metrics["action_entropy"] = action_ent / choice_rows
            if decoupled and toks > 0:  # per response token of this agent
                metrics.update(is_weight_mean=is_w / toks, is_weight_max=float(is_max[s]),
                               is_weight_truncated=is_trunc / toks)
            if gap_metric and toks > 0:  # trainer vs engine on the rows' own adapter (was the pi_old pass's)
                metrics.update(logprob_gap=gap / toks, logprob_gap_max=float(gap_max[s]))
            result.agent_metrics[agent_id] = metrics
        return result

    def step_micro_batches(self, micro: list[np.ndarray], batch_idx: np.ndarray,
                           micro_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
                           ) -> tuple[float, bool]:
        """One optimizer step over this rank's micro-batches of a mini-batch: (grad norm, stepped).

        ``micro_loss(idx, real)`` returns the loss of rows ``idx`` ((b,) int64), already divided by the
        mini-batch's global count; ``real`` ((b,) float32) is 0 on the placeholder row an empty
        micro-batch runs (this rank has fewer than another: every rank must run as many backwards).
        A non-finite gradient reaches neither the weights nor Adam's moments: no step (stepped False).
        """
        for j, rows_j in enumerate(micro):
            idx = rows_j if len(rows_j) else batch_idx[:1]
            real = np.full(len(idx), 1.0 if len(rows_j) else 0.0, dtype=np.float32)
            self.engine.set_gradient_accumulation_boundary(j == len(micro) - 1)
            loss = micro_loss(torch.from_numpy(idx), torch.from_numpy(real))
            self.engine.backward(loss, scale_wrt_gas=False)
        norm = self._local_grad_norm()
        if norm is not None and not math.isfinite(norm):
            # ZeRO-1/2 skip such steps themselves; ZeRO-0's torch optimizer would not
            for p in self.params:
                p.grad = None
            return norm, False
        if norm is not None:
            self._clip_local(norm)
        self.engine.step()
        if norm is None:
            ds_norm = self.engine.get_global_grad_norm()
            norm = float(ds_norm) if ds_norm is not None else 0.0
        return norm, True

    def reset_optimizer(self, lr: float | None = None) -> None:
        """A fresh optimizer for a new training phase (as a new trainer would have): Adam's moments and
        step counts dropped, the lr schedule back at its start, peaking at ``lr`` if given. The weights
        stay as they are."""
        # torch's Adam re-creates a parameter's state at its next step
        self.engine.basic_optimizer.state.clear()
        fresh = copy.deepcopy(self._fresh_schedule)
        if lr is not None:
            fresh["base_lrs"] = [float(lr)] * len(fresh["base_lrs"])
        sched = self.engine.lr_scheduler
        sched.load_state_dict(fresh)
        groups = self.engine.basic_optimizer.param_groups
        for group, base, fn in zip(groups, sched.base_lrs, sched.lr_lambdas, strict=True):
            group["lr"] = base * fn(sched.last_epoch)
        sched._last_lr = [g["lr"] for g in groups]

    def distill(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, choices: list[list[list[int]]],
                targets: torch.Tensor, max_steps: int, stop_prob: float) -> dict[str, float]:
        """Supervised steps on given answers until each is the policy's pick at ``stop_prob`` or more.

        prompt_ids, prompt_mask: (b, P) left-padded prompts; ``choices[i]`` the token ids of row i's
        legal answers; targets: (b,) the index of the answer to learn. The loss is the negative
        log-likelihood of that answer's tokens (mean over rows); the stop test renormalises over the
        legal answers. Every rank gets the same rows (DeepSpeed averages identical gradients).
        Each step is an optimizer step of this policy (it advances its lr schedule).
        """
        self.activate()
        self.engine.train()
        ids, mask = prompt_ids.to(self.device), prompt_mask.to(self.device)
        targets = targets.to(self.device)
        steps, first, last = 0, None, 0.0
        while True:
            lp, real = choice_log_probs(self.engine, ids, mask, choices)  # (b, K) each
            target_lp = lp.gather(1, targets[:, None]).squeeze(1)  # (b,)
            picked = torch.softmax(lp.detach().masked_fill(real == 0, float("-inf")), -1)  # (b, K)
            last = float(picked.gather(1, targets[:, None]).min())  # the least-learned row
            # every rank must take the same number of steps (each step's backward reduces across ranks)
            last = float(all_reduce_sum(torch.tensor([last]), self.device)[0]) / self.world_size
            first = last if first is None else first
            if last >= stop_prob or steps >= max_steps:
                break
            loss = -target_lp.mean()
            if not torch.isfinite(loss):
                raise FloatingPointError(f"policy {self.name!r}: distillation loss is {float(loss)}")
            self.engine.set_gradient_accumulation_boundary(True)
            self.engine.backward(loss, scale_wrt_gas=False)
            self.engine.step()
            steps += 1
        return {"steps": float(steps), "target_prob_min_before": first, "target_prob_min_after": last}

    def _micro_loss(self, cols: dict[str, torch.Tensor], idx: torch.Tensor, real: torch.Tensor,
                    row_slot: torch.Tensor, local_denom: float, temperature: float,
                    num_slots: int, entropy_coef: float, bonus: _ActionBonus | None,
                    choice_denom: float, decoupled: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Loss of one micro-batch (already divided by the mini-batch's count) and per-agent metric sums."""
        algo, dev = self.algo_cfg, self.device
        ids = cols["input_ids"][idx].to(dev)  # (b, T)
        attn = cols["attention_mask"][idx].to(dev)  # (b, T)
        mask = cols["response_mask"][idx].to(dev).float() * real.to(dev)[:, None]  # (b, R) pad rows count 0
        adv = cols["advantages"][idx].to(dev).float()  # (b, R)
        log_probs, entropy = response_log_probs(
            self.engine, ids, attn, mask.shape[1], temperature=temperature, with_entropy=True,
            remove_padding=self.batching.remove_padding,
            chunk_tokens=self.batching.chunk_tokens)  # (b, R) each
        # (b, R) pi_old: scored before the update, or (one optimizer step on fresh rows) this very forward
        old = (cols["old_log_probs"][idx].to(dev).float() if "old_log_probs" in cols
               else log_probs.detach())
        weights = truncated = gap = None
        if decoupled:  # clip against pi_old (proximal), weight pi_old / pi_behav
            behav = cols["rollout_log_probs"][idx].to(dev).float()  # (b, R)
            weights, truncated = behavior_weights(old, behav, algo.is_weight_cap)  # (b, R) each
        elif "rollout_log_probs" in cols:  # reused pi_old: the trainer-vs-engine gap comes from here
            gap = (old - cols["rollout_log_probs"][idx].to(dev).float()).abs()  # (b, R)
        loss, _ = ppo_clip_loss(log_probs, old, adv, mask, algo.clip_ratio_low, algo.clip_ratio_high,
                                algo.loss_agg, local_denom, weights)
        kl = None
        if "ref_log_probs" in cols:
            ref = cols["ref_log_probs"][idx].to(dev).float()  # (b, R)
            kl = kl_estimate(log_probs, ref, algo.kl_estimator)  # (b, R)
            if algo.kl_coef > 0 and algo.kl_mode == "loss":
                loss = loss + algo.kl_coef * aggregate(kl, mask, algo.loss_agg, local_denom)
        if entropy_coef > 0:
            loss = loss - entropy_coef * aggregate(entropy, mask, algo.loss_agg, local_denom)
        action_ent = choice_rows = None
        if bonus is not None and choice_denom > 0:
            choice_rows = torch.from_numpy(bonus.has_choice[idx.numpy()]).to(dev) * real.to(dev)  # (b,)
            action_ent = self._action_entropy(cols, idx, bonus, temperature)  # (b,)
            loss = loss - bonus.coef * (action_ent * choice_rows).sum() / choice_denom

        sums = torch.zeros(num_slots, len(_SUMS), dtype=torch.float64)
        with torch.no_grad():
            slots = row_slot[idx]
            lp, ent = log_probs.detach(), entropy.detach()
            for s in torch.unique(slots[real > 0]).tolist():
                agent_mask = mask * (slots == s).to(dev, mask.dtype)[:, None]  # (b, R) this agent's tokens
                # denominator 1: sums, divided by the agent's total count after all micro-batches and ranks
                pl, stats = ppo_clip_loss(lp, old, adv, agent_mask, algo.clip_ratio_low, algo.clip_ratio_high,
                                          algo.loss_agg, 1.0, weights)
                is_w = is_trunc = 0.0
                if weights is not None:
                    is_w = float((weights * agent_mask).sum())
                    is_trunc = float((truncated.to(agent_mask.dtype) * agent_mask).sum())
                    if agent_mask.any():
                        self._is_max[s] = max(float(self._is_max[s]), float(weights[agent_mask > 0].max()))
                gap_sum = 0.0
                if gap is not None and agent_mask.any():
                    gap_sum = float((gap * agent_mask).sum())
                    self._gap_max[s] = max(float(self._gap_max[s]), float((gap * agent_mask).max()))
                toks = float(agent_mask.sum())
                units = toks if algo.loss_agg == "token_mean" else float(((slots == s) & (real > 0)).sum())
                kl_sum = 0.0 if kl is None else float(aggregate(kl.detach(), agent_mask, algo.loss_agg, 1.0))
                ent_sum = float(aggregate(ent, agent_mask, algo.loss_agg, 1.0))
                a_ent = a_rows = 0.0
                if action_ent is not None:
                    agent_rows = choice_rows * (slots == s).to(dev, choice_rows.dtype)  # (b,)
                    a_ent, a_rows = float((action_ent.detach() * agent_rows).sum()), float(agent_rows.sum())
                sums[s] = torch.tensor([float(pl), kl_sum, ent_sum, stats["clip_frac"] * toks, toks, units,
                                        a_ent, a_rows, is_w, is_trunc, gap_sum], dtype=torch.float64)
        return loss, sums

    def _action_entropy(self, cols: dict[str, torch.Tensor], idx: torch.Tensor, bonus: _ActionBonus,
                        temperature: float) -> torch.Tensor:
        """(b,) entropy of each row's choice among its legal actions, under the policy being trained."""
        prompt_len = cols["input_ids"].shape[1] - cols["responses"].shape[1]
        prompt_ids = cols["input_ids"][idx, :prompt_len].to(self.device)  # (b, P) left-padded
        prompt_mask = cols["attention_mask"][idx, :prompt_len].to(self.device)  # (b, P)
        lp, mask = choice_log_probs(self.engine, prompt_ids, prompt_mask,
                                    [bonus.choices[int(i)] for i in idx], temperature)  # (b, K) each
        return choice_entropy(lp, mask)

    def _clip_local(self, norm: float) -> None:
        """ZeRO-0: scale this policy's gradients of (pre-clip) norm ``norm`` down to train.grad_clip, by
        DeepSpeed's rule (coefficient max_norm / (norm + 1e-6), at most 1), whose own clipping is off at
        stage 0 (ds_utils.deepspeed_config)."""
        max_norm = float(self.train_cfg.grad_clip)
        if max_norm > 0 and max_norm / (norm + 1e-6) < 1.0:  # torch's clip_grads_with_norm_: the same rule
            torch.nn.utils.clip_grads_with_norm_(self.params, max_norm, torch.tensor(norm))

    def _local_grad_norm(self) -> float | None:
        """ZeRO-0 leaves the (rank-averaged) gradients on the parameters and reports no norm: compute it."""
        if self.zero_stage != 0:
            return None
        grads = [p.grad.detach().float() for p in self.params if p.grad is not None]
        if not grads:
            return 0.0
        return float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])))

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        """This rank's optimizer state (its ZeRO shard at stage 1/2), lr schedule and engine counters."""
        e = self.engine
        return {"optimizer": e.optimizer.state_dict(), "lr_scheduler": e.lr_scheduler.state_dict(),
                "global_steps": e.global_steps, "global_samples": e.global_samples,
                "skipped_steps": e.skipped_steps, "zero_stage": self.zero_stage,
                "world_size": self.world_size}

    def load_state_dict(self, shards: list[dict[str, Any]]) -> None:
        """Restore from the shards of every rank (ZeRO 1/2) or the one replicated state (ZeRO-0)."""
        first = shards[0]
        if first["zero_stage"] != self.zero_stage:
            saved = first["zero_stage"]
            raise ValueError(f"policy {self.name!r}: the checkpoint was written at ZeRO-{saved} but "
                             f"train.zero_stage={self.zero_stage}; resume with the same stage")
        if self.zero_stage > 0 and len(shards) != self.world_size:
            raise ValueError(f"policy {self.name!r}: the checkpoint holds {len(shards)} ZeRO shards but "
                             f"train.num_workers={self.world_size}; resume with the same number of workers")
        mine = shards[self.rank] if self.zero_stage > 0 else first
        opt = self.engine.optimizer
        params = inspect.signature(opt.load_state_dict).parameters
        kwargs = {k: True for k in ("load_optimizer_states", "load_from_fp32_weights") if k in params}
        if "state_dict_list" in params:  # DeepSpeed's ZeRO / bf16 optimizers read the shard of their dp rank
            replicated = shards if self.zero_stage > 0 else [first] * self.world_size
            opt.load_state_dict([s["optimizer"] for s in replicated], **kwargs)
        else:
            opt.load_state_dict(mine["optimizer"], **kwargs)
        self.engine.lr_scheduler.load_state_dict(mine["lr_scheduler"])
        self.engine.global_steps = mine["global_steps"]
        self.engine.global_samples = mine["global_samples"]
        self.engine.skipped_steps = mine["skipped_steps"]
