"""One policy's DeepSpeed engine: the optimizer over exactly that policy's parameters, and its steps.

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

What is optimised is not decided here: ``update_loop.run_update`` drives this engine with an
objective's micro-batch loss (PPO, SFT, DPO, the critic's value loss).
"""

from __future__ import annotations

import copy
import inspect
import math
from collections.abc import Callable
from typing import Any

import torch

from roll_ma.config.schema import TrainConfig
from roll_ma.models.logprobs import choice_log_probs
from roll_ma.training.ds_utils import all_reduce_sum, deepspeed_config, setup_deepspeed
from roll_ma.training.lr_schedule import make_lr_scheduler
from roll_ma.training.micro_batches import MicroBatching


class PolicyEngine:
    """The DeepSpeed engine of one policy (an agent's adapter, all weights, or a critic's adapter + head).

    Args:
        name: policy name (the adapter name, or "full" in full fine-tuning).
        index: position of the policy in config order (seeds its mini-batch shuffling).
        model: the shared model (a PeftModel holding every adapter, or the base model).
        params: this policy's parameters; the optimizer holds these and nothing else.
        activate: makes this policy the one that runs and trains (adapter + requires_grad).
        lr: peak learning rate of this policy.
        train_cfg: batch shapes, ZeRO stage, gradient clipping, lr schedule.
    """

    def __init__(self, name: str, index: int, model: Any, params: list[torch.nn.Parameter],
                 activate: Callable[[], None], lr: float, train_cfg: TrainConfig, seed: int, rank: int,
                 world_size: int, device: torch.device, total_steps: int | None = None):
        if not params:
            raise ValueError(f"policy {name!r} has no parameters to train")
        self.name, self.index, self.seed = name, index, seed
        self.rank, self.world_size, self.device = rank, world_size, device
        self.train_cfg = train_cfg
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

    # ------------------------------------------------------------------ steps
    def start_update(self, keep_train_mode: bool = False) -> None:
        """Make this policy the one that runs and trains, in train mode (``keep_train_mode``: only if the
        module's root is not in it already, which skips a walk over every module)."""
        self.activate()
        if not (keep_train_mode and self.engine.module.training):
            self.engine.train()

    def begin_micro_batch(self, last: bool) -> None:
        """Before a micro-batch's forward: whether its backward closes the mini-batch (reduces, may step)."""
        self.engine.set_gradient_accumulation_boundary(last)

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradient of ``loss`` (already divided by the mini-batch's global count)."""
        self.engine.backward(loss, scale_wrt_gas=False)

    def optimizer_step(self) -> tuple[float, bool]:
        """One optimizer step over the accumulated gradients: (grad norm, stepped).

        A non-finite gradient reaches neither the weights nor Adam's moments: no step (stepped False).
        """
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
