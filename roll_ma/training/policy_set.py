"""policy_set: one LoRA adapter per agent on one shared base, updated agent after agent (the trainer's core).

1. ``initialize`` loads the base, injects EVERY adapter (PEFT) and only then builds one
   DeepSpeed engine per trainable adapter on the shared PeftModel (``PolicyEngine``);
   each engine's optimizer holds only that adapter's parameters.
2. ``train_step`` partitions the batch by ``agent_id`` -> adapter and updates the adapters
   one after another in config order, each only from its own rows (agents sharing an
   adapter update it together). Frozen agents and agents the request does not name as due (the run
   plan's train cycle) are skipped; their adapters and optimizer states stay untouched.
3. Data parallel: every rank receives the full batch and trains on its share of each
   mini-batch; metrics are all-reduced, so every rank returns the same numbers.

The value critic (``critic.py``) and the checkpoint (``policy_checkpoint.py``: adapters, critic heads, every
optimizer's state) are collaborators this core holds; DPO's reference (``dpo_reference.py``) plugs in
from ``multi_agent_deepspeed``; a study's pass (``roll_ma/studies``) is given the set by the train worker.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from roll_ma.config.run_plan import needs_critic
from roll_ma.config.schema import AlgorithmConfig, CriticConfig, ModelConfig, StudyConfig, TrainConfig
from roll_ma.distributed import activity
from roll_ma.models.adapters import AdapterSpec, AgentSpec
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import UpdateRequest, UpdateResult
from roll_ma.training import policy_checkpoint
from roll_ma.training.critic import CriticSet, critic_specs
from roll_ma.training.ds_utils import setup_deepspeed, training_device
from roll_ma.training.micro_batches import MicroBatching
from roll_ma.training.objectives import objective_named
from roll_ma.training.policy_engine import PolicyEngine
from roll_ma.training.policy_plan import (
    check_agents,
    plan_policies,
    reference_copy_names,
    requested_plans,
    row_agent_ids,
    rows_by_policy,
)
from roll_ma.training.policy_weights import FullWeights, LoraWeights
from roll_ma.training.scoring import check_columns, log_prob_columns
from roll_ma.training.update_loop import LossTermMaker, UpdateContext
from roll_ma.training.update_metrics import agent_row_metrics, agent_update_metrics, token_totals

DEFAULT_UPDATE = UpdateRequest()  # a ppo update at step 0 of every trainable agent


class PolicySet:
    """Per-agent LoRA training with DeepSpeed: one engine and optimizer per trainable adapter.

    Args:
        model_cfg: the shared base model.
        agents: every agent (index = ``agent_id``), from ``plan_adapters``.
        adapters: every adapter the agents use (first-use order), from ``plan_adapters``.
        train_cfg: optimizer, ZeRO stage, batch shapes.
        algo_cfg: loss settings (PPO clip, KL, entropy, aggregation).
        seed: seed of adapter init and mini-batch shuffling.
        rank, world_size: this process in the data-parallel group of train workers.
        study_cfg: the study settings the update passes on to its extra loss terms.
        loss_terms: a study's extra terms of the PPO loss (``LossTermMaker``: the action entropy bonus of
            ``roll_ma/studies``), given by the train worker's spec.
        reference_copies: also inject a frozen copy of every trainable adapter (DPO's reference "the
            adapter as the phase started": ``dpo_reference.snapshot_reference`` fills it; no second model).
        critic_cfg: the value critic(s) of ``algorithm.advantage=gae`` (``training/critic.py``): one
            more adapter each on the same base, plus a value head.
    """

    def __init__(self, model_cfg: ModelConfig, agents: Sequence[AgentSpec], adapters: Sequence[AdapterSpec],
                 train_cfg: TrainConfig, algo_cfg: AlgorithmConfig, seed: int = 0, rank: int = 0,
                 world_size: int = 1, reference_copies: bool = False, study_cfg: StudyConfig | None = None,
                 critic_cfg: CriticConfig | None = None, loss_terms: Sequence[LossTermMaker] = ()):
        # the update, the critic and the scoring read true or false, as the run plan decided it (padded rows
        # share nothing: auto is off there whatever the attention)
        if train_cfg.share_prompt_prefix == "auto" and train_cfg.remove_padding:
            raise ValueError("train.share_prompt_prefix=auto reaches the trainer undecided: give it the run "
                             "plan's choice (RunPlan.worker_train_config)")
        self.model_cfg, self.train_cfg, self.algo_cfg = model_cfg, train_cfg, algo_cfg
        self.study_cfg = study_cfg or StudyConfig()
        self.loss_terms = tuple(loss_terms)
        self.critic_cfg = critic_cfg or CriticConfig()
        self.critic: CriticSet | None = None
        self.agents, self.adapters = list(agents), list(adapters)
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.reference_copies = reference_copies
        self.copied_adapters = reference_copy_names(self.agents, reference_copies)
        self.weights = self._make_weights()
        check_agents(self.agents, self.adapters, algo_cfg, self.weights.has_adapters)
        self.device = training_device()
        self.model: Any = None
        self.updaters: dict[str, PolicyEngine] = {}
        self.plans = plan_policies(self.agents, self.weights.policy_of, train_cfg.lr)

    def _make_weights(self) -> LoraWeights | FullWeights:
        """What the policies are: here one LoRA adapter each (deepspeed_train may pick all weights)."""
        if self.train_cfg.full_finetune:
            raise ValueError("train.full_finetune needs train.strategy=deepspeed_train (one policy)")
        return self._lora_weights()

    def _lora_weights(self) -> LoraWeights:
        """Every adapter, the DPO reference copies and the critics' adapters on the base."""
        return LoraWeights(self.model_cfg, self.adapters, self.seed, self.copied_adapters,
                           critic_specs(self.agents, self.adapters, self.algo_cfg.advantage, self.critic_cfg),
                           self.train_cfg.lora_compute_dtype == "model")

    def initialize(self, total_steps: int | None = None) -> None:
        """Load the model (adapters injected first) and build one DeepSpeed engine per policy.

        Args:
            total_steps: horizon of the linear/cosine lr decay, in optimizer steps of each policy
                (default: no decay within any practical run).
        """
        activity.note("initialize: starting DeepSpeed")
        setup_deepspeed(self.rank, self.world_size)
        torch.manual_seed(self.seed)
        activity.note(f"initialize: loading {self.model_cfg.path} and the adapters")
        self.model = self.weights.build(self.device)
        for index, plan in enumerate(self.plans):
            activity.note(f"initialize: building the DeepSpeed engine of {plan.name}")
            self.updaters[plan.name] = PolicyEngine(
                plan.name, index, self.model, self.weights.params(plan.name),
                functools.partial(self.weights.activate, plan.name), plan.lr, self.train_cfg,
                self.seed, self.rank, self.world_size, self.device, total_steps)
        if needs_critic(self.algo_cfg.advantage):  # (full fine-tuning never reaches here: _policy_weights)
            activity.note("initialize: building the value critic(s)")
            self.critic = CriticSet(self.weights, self.agents, self.critic_cfg, self.train_cfg,
                                    self.seed, self.rank, self.world_size, self.device, total_steps)
        self.weights.activate(None)

    def require_model(self) -> None:
        if self.model is None:
            raise RuntimeError("call initialize() first")

    # ------------------------------------------------------------------ rows -> agents
    def agent_ids(self, data: DataProto) -> np.ndarray:
        """(B,) int64 the ``agent_id`` of every row, checked against the agents (``policy_plan``)."""
        return row_agent_ids(data, len(self.agents))

    def scoring_groups(self, agent_ids: np.ndarray) -> dict[str, np.ndarray]:
        """Row positions per policy that scores them (frozen agents' adapters included)."""
        return rows_by_policy(agent_ids, self.agents, self.weights.policy_of)

    # ------------------------------------------------------------------ scoring
    def compute_log_probs(self, data: DataProto, adapters_enabled: bool = True, temperature: float = 1.0,
                          with_entropy: bool = False) -> DataProto:
        """(B, R) float32 ``old_log_probs`` (each row with its agent's adapter) or, with adapters disabled,
        ``ref_log_probs`` from the base weights; plus ``entropy`` when asked. Eval mode, no grad."""
        self.require_model()
        by_policy = None  # the base: every adapter off
        if adapters_enabled:
            by_policy = self.scoring_groups(self.agent_ids(data)) if len(data) else {}
        batching = MicroBatching.for_scoring(self.train_cfg)
        return log_prob_columns(self.model, self.weights, data, by_policy, batching, self.device, temperature,
                                with_entropy)

    def compute_values(self, data: DataProto) -> DataProto:
        """(B, R) float32 ``values``: each row under its agent's critic (forward only, no grad)."""
        self.require_model()
        if self.critic is None:
            raise ValueError("this strategy has no critic: set algorithm.advantage=gae")
        check_columns(data, ("input_ids", "attention_mask", "responses"), "compute values")
        values = self.critic.compute_values(data, self.agent_ids(data) if len(data) else np.zeros(0, int))
        return DataProto.from_dict({"values": values}, meta_info=data.meta_info)

    # ------------------------------------------------------------------ training
    def train_step(self, data: DataProto, request: UpdateRequest = DEFAULT_UPDATE) -> UpdateResult:
        """Update every due policy from its agents' rows, by ``request.objective`` (ppo, sft, dpo:
        ``training/objectives.py``); ``request``: the step, the policies, the agents due, critic-only (the
        default: a ppo update at step 0 of every trainable agent).

        Returns the agents and adapters that took an optimizer step, and the metrics:
        ``agent/<name>/<metric>`` of every agent and ``timing/update/<adapter>`` (seconds) of every adapter
        updated.
        """
        self.require_model()
        ctx = UpdateContext(step=request.step, temperature=request.temperature, algo_cfg=self.algo_cfg,
                            study_cfg=self.study_cfg, behavior_correction=request.behavior_correction,
                            dpo=request.dpo, loss_terms=self.loss_terms)
        objective = objective_named(request.objective)
        objective.check(data, self.algo_cfg)
        agent_ids = self.agent_ids(data) if len(data) else np.zeros(0, dtype=np.int64)
        plans, listed = requested_plans(self.plans, self.agents, request)
        row_tokens = objective.row_tokens(data) if len(data) else np.zeros(0)
        metrics = agent_row_metrics(listed, agent_ids, row_tokens)
        stepped_agents: list[int] = []
        updated_adapters: list[str] = []
        for plan in plans:
            due = [a for a in plan.agent_ids if request.agents is None or a in request.agents]
            idx = np.nonzero(np.isin(agent_ids, due))[0]
            if len(idx) == 0:
                continue
            start = time.perf_counter()
            updater = self.updaters[plan.name]
            result = objective.update(updater, data.select_idxs(idx), agent_ids[idx], due, ctx)
            metrics[f"timing/update/{plan.name}"] = time.perf_counter() - start  # per adapter
            if result.optimizer_steps > 0:
                updated_adapters.append(plan.name)
            stepped_agents += agent_update_metrics(metrics, result, agent_ids[idx], self.agents)
        metrics.update(token_totals(metrics))
        if self.critic is not None and objective.trains_critic and request.policies is None and len(data):
            start = time.perf_counter()
            metrics.update(self.critic.update(data, agent_ids, ctx.step))
            # not timing/update/<adapter>: an agent may well be named "critic"
            metrics["timing/value_critic_update"] = time.perf_counter() - start
        self.weights.activate(None)
        return UpdateResult(metrics, tuple(sorted(stepped_agents)), tuple(updated_adapters))

    def reset_optimizers(self, lr: float | None = None) -> None:
        """A fresh optimizer and lr schedule for every policy (a new training phase), peaking at ``lr`` if
        given (else each policy's own lr); weights unchanged."""
        self.require_model()
        for updater in self.updaters.values():
            updater.reset_optimizer(lr)

    # ------------------------------------------------------------------ weights out
    def adapter_tensors(self, adapters: list[str] | None = None, packed: bool = False,
                        dtype: str | None = None, shared: Any = None) -> dict[str, Any]:
        """PEFT-format CPU tensors of the named adapters (default: all of them), for the rollout engine;
        ``packed``: each adapter as one buffer, cast to ``dtype`` on the device when given, on the host
        or (``shared``: a ``SegmentOwner``) in a shared-memory segment."""
        self.require_model()
        return self.weights.adapter_tensors(adapters, packed=packed, dtype=dtype, shared=shared)

    def optimizer_state(self, policy: str) -> dict[str, Any]:
        """CPU copies of one policy's (or critic's) optimizer state (for checks and tests)."""
        return policy_checkpoint.optimizer_state(self._optimizers(), policy)

    def _optimizers(self) -> dict[str, PolicyEngine]:
        return policy_checkpoint.every_optimizer(self.updaters, self.critic)

    # ------------------------------------------------------------------ checkpoint (policy_checkpoint.py)
    def save_checkpoint(self, ckpt_dir: str | os.PathLike) -> None:
        """``adapters/<name>/`` PEFT dirs, critic heads and every optimizer's state (rank shards)."""
        self.require_model()
        policy_checkpoint.save_checkpoint(Path(ckpt_dir), self.weights, self.critic, self._optimizers(),
                                          self.rank)

    def load_checkpoint(self, ckpt_dir: str | os.PathLike) -> None:
        """Restore what ``save_checkpoint`` wrote (same ZeRO stage and number of ranks)."""
        self.require_model()
        policy_checkpoint.load_checkpoint(Path(ckpt_dir), self.weights, self.critic, self._optimizers(),
                                          self.world_size)
