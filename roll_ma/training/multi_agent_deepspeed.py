"""multi_agent_deepspeed: one LoRA adapter per agent on one shared base, updated agent after agent.

How it works:

1. ``initialize`` loads the base, injects EVERY adapter (PEFT) and only then builds one
   DeepSpeed engine per trainable adapter on the shared PeftModel (``PolicyEngine``);
   each engine's optimizer holds only that adapter's parameters.
2. ``train_step`` partitions the batch by ``agent_id`` -> adapter and updates the adapters
   one after another in config order, each only from its own rows (agents sharing an
   adapter update it together). Frozen agents and agents the request does not name as due (the run
   plan's train cycle) are skipped; their adapters and optimizer states stay untouched.
3. Data parallel: every rank receives the full batch and trains on its share of each
   mini-batch; metrics are all-reduced, so every rank returns the same numbers.

``DeepSpeedTrainStrategy`` (deepspeed_train) is this class with a single policy.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from roll_ma.algorithms.algorithm_registry import POLICY_LOSSES
from roll_ma.algorithms.preference import sequence_log_probs
from roll_ma.config.run_plan import needs_critic
from roll_ma.config.schema import AlgorithmConfig, CriticConfig, ModelConfig, StudyConfig, TrainConfig
from roll_ma.distributed import activity
from roll_ma.models.adapters import AdapterSpec, AgentSpec
from roll_ma.models.logprobs import choice_log_probs
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import PairReference, UpdateRequest, UpdateResult
from roll_ma.training.critic import CriticSet, critic_adapter_specs, critic_of_agents
from roll_ma.training.ds_utils import barrier, setup_deepspeed, training_device
from roll_ma.training.micro_batches import MicroBatching
from roll_ma.training.objective_dpo import REF_KEYS, SIDES, side
from roll_ma.training.objectives import objective_named
from roll_ma.training.policy_engine import PolicyEngine
from roll_ma.training.policy_weights import FullWeights, LoraWeights
from roll_ma.training.scoring import check_columns, score_rows
from roll_ma.training.train_backend import (
    DPOCapable,
    JointSearchCapable,
    PhaseCapable,
    TrainBackend,
    TrainTraits,
)
from roll_ma.training.update_loop import UpdateContext

DEFAULT_UPDATE = UpdateRequest()  # a ppo update at step 0 of every trainable agent


@dataclass(frozen=True)
class PolicyPlan:
    """A trainable unit: an adapter (or all weights) and the trainable agents whose rows train it."""

    name: str
    agent_ids: tuple[int, ...]
    lr: float


class MultiAgentDeepSpeedStrategy:
    """Per-agent LoRA training with DeepSpeed: one engine and optimizer per trainable adapter.

    Args:
        model_cfg: the shared base model.
        agents: every agent (index = ``agent_id``), from ``plan_adapters``.
        adapters: every adapter the agents use (first-use order), from ``plan_adapters``.
        train_cfg: optimizer, ZeRO stage, batch shapes.
        algo_cfg: loss settings (PPO clip, KL, entropy, aggregation).
        seed: seed of adapter init and mini-batch shuffling.
        rank, world_size: this process in the data-parallel group of train workers.
        study_cfg: game-study helpers the update uses (the entropy bonus over legal actions).
        reference_copies: also inject a frozen copy of every trainable adapter (DPO's reference "the
            adapter as the phase started": ``snapshot_reference`` fills it; no second model).
        critic_cfg: the value critic(s) of ``algorithm.advantage=gae`` (``training/critic.py``): one
            more adapter each on the same base, plus a value head.
    """

    traits = TrainTraits()  # one adapter per trainable agent; LoRA only

    def __init__(self, model_cfg: ModelConfig, agents: Sequence[AgentSpec], adapters: Sequence[AdapterSpec],
                 train_cfg: TrainConfig, algo_cfg: AlgorithmConfig, seed: int = 0, rank: int = 0,
                 world_size: int = 1, reference_copies: bool = False, study_cfg: StudyConfig | None = None,
                 critic_cfg: CriticConfig | None = None):
        # the update, the critic and the scoring read true or false, as the run plan decided it (padded rows
        # share nothing: auto is off there whatever the attention)
        if train_cfg.share_prompt_prefix == "auto" and train_cfg.remove_padding:
            raise ValueError("train.share_prompt_prefix=auto reaches the trainer undecided: give it the run "
                             "plan's choice (RunPlan.worker_train_config)")
        self.model_cfg, self.train_cfg, self.algo_cfg = model_cfg, train_cfg, algo_cfg
        self.study_cfg = study_cfg or StudyConfig()
        self.critic_cfg = critic_cfg or CriticConfig()
        self.critic: CriticSet | None = None
        self.agents, self.adapters = list(agents), list(adapters)
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.reference_copies = reference_copies
        self.weights = self._make_weights()
        self._check_config()
        self.device = training_device()
        self.model: Any = None
        self.updaters: dict[str, PolicyEngine] = {}
        self.plans = self._plan_policies()

    # ------------------------------------------------------------------ setup
    def _make_weights(self) -> LoraWeights | FullWeights:
        """What the policies are: here one LoRA adapter each (deepspeed_train may pick all weights)."""
        if self.train_cfg.full_finetune:
            raise ValueError("train.full_finetune needs train.strategy=deepspeed_train (one policy)")
        return LoraWeights(self.model_cfg, self.adapters, self.seed, self._copied_adapters(),
                           self._critic_specs(), self.train_cfg.lora_compute_dtype == "model")

    def _lora_weights(self, what: str) -> LoraWeights:
        """The policies' LoRA adapters; full fine-tuning has none (and no reference copies)."""
        if not isinstance(self.weights, LoraWeights):
            raise ValueError(f"{what} needs LoRA adapters; train.full_finetune trains the base weights")
        return self.weights

    def _critic_specs(self) -> list[AdapterSpec]:
        """The critics' adapters (algorithm.advantage=gae), shaped like the first agent's adapter."""
        if not needs_critic(self.algo_cfg.advantage):
            return []
        names = list(critic_of_agents(self.agents, self.critic_cfg.share, self.critic_cfg.groups).values())
        return critic_adapter_specs(self.adapters[0], names, self.critic_cfg)

    def _copied_adapters(self) -> list[str]:
        """The adapters that get a frozen reference copy: every trainable one, when asked for."""
        if not self.reference_copies:
            return []
        return list(dict.fromkeys(a.adapter for a in self.agents if not a.frozen))

    def _check_config(self) -> None:
        POLICY_LOSSES.get(self.algo_cfg.policy_loss)  # an unknown name fails here, before any model loads
        for i, agent in enumerate(self.agents):
            if agent.agent_id != i:
                raise ValueError(f"agents must be listed by agent_id; position {i} holds {agent.agent_id}")
        names = {a.name for a in self.adapters}
        missing = [a.name for a in self.agents if a.adapter not in names]
        if self.weights.has_adapters and missing:
            raise ValueError(f"agents {missing} use adapters that are not among {sorted(names)}")

    def _plan_policies(self) -> list[PolicyPlan]:
        """One policy per distinct policy of the trainable agents, in config (first-use) order."""
        by_policy: dict[str, list[AgentSpec]] = {}
        for agent in self.agents:
            if not agent.frozen:
                by_policy.setdefault(self.weights.policy_of(agent), []).append(agent)
        return [PolicyPlan(name, tuple(a.agent_id for a in agents), self._policy_lr(agents))
                for name, agents in by_policy.items()]

    def _policy_lr(self, agents: Sequence[AgentSpec]) -> float:
        lrs = {a.lr if a.lr is not None else self.train_cfg.lr for a in agents}
        if len(lrs) > 1:
            raise ValueError(f"agents {[a.name for a in agents]} train one policy but set different learning "
                             f"rates {sorted(lrs)}; give them the same lr")
        return lrs.pop()

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

    def _require_model(self) -> None:
        if self.model is None:
            raise RuntimeError("call initialize() first")

    # ------------------------------------------------------------------ rows -> agents
    def _agent_ids(self, data: DataProto) -> np.ndarray:
        if "agent_id" not in data.non_tensor:
            raise ValueError("the batch has no non_tensor 'agent_id' column; every row must name its agent")
        ids = np.asarray([int(a) for a in data.non_tensor["agent_id"]], dtype=np.int64)
        bad = sorted({int(a) for a in ids if not 0 <= a < len(self.agents)})
        if bad:
            raise ValueError(f"agent_id values {bad} are not agents; agent ids are 0..{len(self.agents) - 1}")
        return ids

    def _scoring_groups(self, agent_ids: np.ndarray) -> dict[str, np.ndarray]:
        """Row positions per policy that scores them (frozen agents' adapters included)."""
        names = np.asarray([self.weights.policy_of(self.agents[a]) for a in agent_ids], dtype=object)
        return {name: np.nonzero(names == name)[0] for name in dict.fromkeys(names.tolist())}

    # ------------------------------------------------------------------ scoring
    def compute_log_probs(self, data: DataProto, adapters_enabled: bool = True, temperature: float = 1.0,
                          with_entropy: bool = False) -> DataProto:
        """(B, R) float32 ``old_log_probs`` (each row with its agent's adapter) or, with adapters disabled,
        ``ref_log_probs`` from the base weights; plus ``entropy`` when asked. Eval mode, no grad."""
        self._require_model()
        key = "old_log_probs" if adapters_enabled else "ref_log_probs"
        check_columns(data, ("input_ids", "attention_mask", "responses"), f"compute {key}")
        n, resp_len = data.batch["responses"].shape
        log_probs = torch.zeros(n, resp_len, dtype=torch.float32)  # (B, R)
        entropy = torch.zeros(n, resp_len, dtype=torch.float32) if with_entropy else None  # (B, R)
        self.model.eval()
        self.weights.activate(None)
        batching = MicroBatching.for_scoring(self.train_cfg)
        groups: dict[str | None, np.ndarray]
        if adapters_enabled:
            by_policy = self._scoring_groups(self._agent_ids(data)) if n else {}
            groups = {name: idx for name, idx in by_policy.items()}
        else:
            groups = {None: np.arange(n)}  # None: every adapter off
        for name, idx in groups.items():
            rows = data.select_idxs(idx)
            with self.weights.scoring(name):
                lp, ent = score_rows(self.model, rows, batching, self.device, temperature, with_entropy)
            log_probs[torch.from_numpy(idx)] = lp
            if entropy is not None:
                assert ent is not None  # asked for with_entropy
                entropy[torch.from_numpy(idx)] = ent
        tensors = {key: log_probs, **({"entropy": entropy} if entropy is not None else {})}
        return DataProto.from_dict(tensors, meta_info=data.meta_info)

    def compute_values(self, data: DataProto) -> DataProto:
        """(B, R) float32 ``values``: each row under its agent's critic (forward only, no grad)."""
        self._require_model()
        if self.critic is None:
            raise ValueError("this strategy has no critic: set algorithm.advantage=gae")
        check_columns(data, ("input_ids", "attention_mask", "responses"), "compute values")
        values = self.critic.compute_values(data, self._agent_ids(data) if len(data) else np.zeros(0, int))
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
        self._require_model()
        ctx = UpdateContext(step=request.step, temperature=request.temperature, algo_cfg=self.algo_cfg,
                            study_cfg=self.study_cfg, behavior_correction=request.behavior_correction,
                            dpo=request.dpo)
        objective = objective_named(request.objective)
        objective.check(data, self.algo_cfg)
        agent_ids = self._agent_ids(data) if len(data) else np.zeros(0, dtype=np.int64)
        row_tokens = objective.row_tokens(data) if len(data) else np.zeros(0)
        # request.policies: update only these (the streaming sync updates one adapter per call)
        only = request.policies
        plans = [p for p in self.plans if only is None or p.name in only]
        if request.critic_only:  # critic.warmup_steps: the agents wait
            plans = []
        mine_agents = {a for p in plans for a in p.agent_ids} if only is not None else None
        metrics: dict[str, float] = {}
        stepped_agents: list[int] = []
        updated_adapters: list[str] = []
        for agent in self.agents:
            if mine_agents is not None and agent.agent_id not in mine_agents:
                continue
            mine = agent_ids == agent.agent_id
            prefix = f"agent/{agent.name}/"
            metrics[prefix + "rows"] = float(mine.sum())
            metrics[prefix + "tokens"] = float(row_tokens[mine].sum())
            metrics[prefix + "updated"] = 0.0

        for plan in plans:
            due = [a for a in plan.agent_ids if request.agents is None or a in request.agents]
            idx = np.nonzero(np.isin(agent_ids, due))[0]
            if len(idx) == 0:
                continue
            updater = self.updaters[plan.name]
            start = time.perf_counter()
            result = objective.update(updater, data.select_idxs(idx), agent_ids[idx], due, ctx)
            metrics[f"timing/update/{plan.name}"] = time.perf_counter() - start  # per adapter
            stepped = result.optimizer_steps > 0
            if stepped:
                updated_adapters.append(plan.name)
            for agent_id, agent_metrics in result.agent_metrics.items():
                if not (agent_ids[idx] == agent_id).any():
                    continue
                prefix = f"agent/{self.agents[agent_id].name}/"
                metrics.update({prefix + k: v for k, v in agent_metrics.items()})
                metrics.update({prefix + "grad_norm": result.grad_norm, prefix + "lr": result.lr,
                                prefix + "updated": float(stepped),
                                prefix + "skipped_nonfinite": float(result.skipped_nonfinite)})
                if stepped:
                    stepped_agents.append(agent_id)
        # the step's trainer tokens (every agent's prompt + response tokens, x epochs) and those the update
        # ran: fewer by each repeated prompt under train.share_prompt_prefix (the GPU table's figure)
        inputs = [v for k, v in metrics.items() if k.startswith("agent/") and k.endswith("/input_tokens")]
        if inputs:
            metrics["train/tokens"] = float(sum(inputs))
            metrics["train/tokens_deduplicated"] = float(sum(
                v for k, v in metrics.items() if k.startswith("agent/") and k.endswith("/input_tokens_run")))
        if self.critic is not None and objective.trains_critic and only is None and len(data):
            start = time.perf_counter()
            metrics.update(self.critic.update(data, agent_ids, ctx.step))
            # not timing/update/<adapter>: an agent may well be named "critic"
            metrics["timing/value_critic_update"] = time.perf_counter() - start
        self.weights.activate(None)
        return UpdateResult(metrics, tuple(sorted(stepped_agents)), tuple(updated_adapters))

    # ------------------------------------------------------------------ supervised phases
    def compute_pair_ref_log_probs(self, data: DataProto, reference: PairReference = "copy") -> DataProto:
        """(N,) ``ref_chosen_logps`` and ``ref_rejected_logps`` of DPO pair rows: summed response log-probs
        under each row's frozen adapter copy (``reference="copy"``) or the base with adapters off ("base")."""
        self._require_model()
        if reference not in ("copy", "base"):
            raise ValueError(f"reference must be 'copy' or 'base', got {reference!r}")
        n = len(data)
        out = {k: torch.zeros(n, dtype=torch.float32) for k in REF_KEYS}
        self.model.eval()
        self.weights.activate(None)
        batching = MicroBatching.for_scoring(self.train_cfg)
        groups = self._scoring_groups(self._agent_ids(data)) if n else {}
        for name, idx in groups.items():
            scorer: str | None = None  # "base": adapters off
            if reference == "copy":
                scorer = self._lora_weights("reference='copy'").reference_copy(name)
            for key, which in zip(REF_KEYS, SIDES, strict=True):
                rows = side(data.select_idxs(idx), which)
                with self.weights.scoring(scorer):
                    lp, _ = score_rows(self.model, rows, batching, self.device)
                out[key][torch.from_numpy(idx)] = sequence_log_probs(lp, rows.batch["response_mask"].float())
        self.weights.activate(None)
        return DataProto.from_dict(out, meta_info=data.meta_info)

    def snapshot_reference(self) -> list[str]:
        """Copy every trainable adapter into its frozen reference copy (DPO: a phase or iteration starts)."""
        self._require_model()
        names = self._copied_adapters()
        if not names:
            raise ValueError("this strategy was built without reference copies (reference_copies=False)")
        weights = self._lora_weights("snapshot_reference")
        for name in names:
            weights.snapshot(name)
        self.weights.activate(None)
        return names

    def reset_optimizers(self, lr: float | None = None) -> None:
        """A fresh optimizer and lr schedule for every policy (a new training phase), peaking at ``lr`` if
        given (else each policy's own lr); weights unchanged."""
        self._require_model()
        for updater in self.updaters.values():
            updater.reset_optimizer(lr)

    # ------------------------------------------------------------------ choices (joint search)
    def _choice_rows(self, data: DataProto) -> tuple[torch.Tensor, torch.Tensor, list[list[list[int]]]]:
        check_columns(data, ("input_ids", "attention_mask"), "score the answers of")
        if "action_choices" not in data.non_tensor:
            raise ValueError("the rows carry no 'action_choices' (token ids of every legal answer)")
        choices = [list(c) for c in data.non_tensor["action_choices"]]
        return data.batch["input_ids"], data.batch["attention_mask"], choices

    def score_choices(self, data: DataProto) -> DataProto:
        """(B, K) ``choice_log_probs``: log pi(answer | prompt) of each row's legal answers under its
        agent's adapter (-inf past a row's own answers). Rows are prompts only (left-padded)."""
        self._require_model()
        ids, mask, choices = self._choice_rows(data)
        width = max((len(c) for c in choices), default=0)
        out = torch.full((len(data), width), float("-inf"), dtype=torch.float32)  # (B, K)
        self.model.eval()
        self.weights.activate(None)
        for name, idx in (self._scoring_groups(self._agent_ids(data)) if len(data) else {}).items():
            sel = torch.from_numpy(idx)
            with self.weights.scoring(name), torch.no_grad():
                lp, real = choice_log_probs(self.model, ids[sel].to(self.device), mask[sel].to(self.device),
                                            [choices[i] for i in idx])
            out[sel, : lp.shape[1]] = lp.float().cpu().masked_fill(real.cpu() == 0, float("-inf"))
        return DataProto.from_dict({"choice_log_probs": out}, meta_info=data.meta_info)

    def distill_choices(self, data: DataProto, max_steps: int, stop_prob: float) -> dict[str, float]:
        """Teach every row's agent the answer ``target_action`` (index into its legal answers).

        Each policy learns from its own agents' rows only, with its own optimizer (see
        ``PolicyEngine.distill``). Returns ``<adapter>/<metric>`` per policy trained.
        """
        self._require_model()
        ids, mask, choices = self._choice_rows(data)
        if "target_action" not in data.non_tensor:
            raise ValueError("the rows carry no 'target_action' (the answer each row should learn)")
        targets = torch.tensor([int(t) for t in data.non_tensor["target_action"]], dtype=torch.long)
        agent_ids = self._agent_ids(data)
        trained = {a for plan in self.plans for a in plan.agent_ids}
        frozen = sorted({self.agents[a].name for a in agent_ids.tolist() if a not in trained})
        if frozen:
            raise ValueError(f"rows of frozen agents {frozen} cannot be distilled into their adapters")
        metrics: dict[str, float] = {}
        for plan in self.plans:
            idx = np.nonzero(np.isin(agent_ids, plan.agent_ids))[0]
            if len(idx) == 0:
                continue
            sel = torch.from_numpy(idx)
            result = self.updaters[plan.name].distill(
                ids[sel], mask[sel], [choices[i] for i in idx], targets[sel], max_steps, stop_prob)
            metrics.update({f"{plan.name}/{k}": v for k, v in result.items()})
        self.weights.activate(None)
        return metrics

    # ------------------------------------------------------------------ weights out
    def adapter_tensors(self, adapters: list[str] | None = None, packed: bool = False,
                        dtype: str | None = None, shared: Any = None) -> dict[str, Any]:
        """PEFT-format CPU tensors of the named adapters (default: all of them), for the rollout engine;
        ``packed``: each adapter as one buffer, cast to ``dtype`` on the device when given, on the host
        or (``shared``: a ``SegmentOwner``) in a shared-memory segment."""
        self._require_model()
        return self.weights.adapter_tensors(adapters, packed=packed, dtype=dtype, shared=shared)

    def _all_updaters(self) -> dict[str, PolicyEngine]:
        """Every optimizer: the agents' policies and the critics."""
        return {**self.updaters, **(self.critic.updaters if self.critic is not None else {})}

    def optimizer_state(self, policy: str) -> dict[str, Any]:
        """CPU copies of one policy's (or critic's) Adam moments and step counts (for checks and tests)."""
        updaters = self._all_updaters()
        if policy not in updaters:
            known = sorted(updaters)
            raise KeyError(f"{policy!r} has no optimizer (frozen or unknown); policies with one: {known}")
        return updaters[policy].optimizer_state()

    # ------------------------------------------------------------------ checkpoint
    def save_checkpoint(self, ckpt_dir: str | os.PathLike) -> None:
        """``adapters/<name>/`` PEFT dirs (rank 0) and ``optim/<policy>/rank<r>.pt`` optimizer states.

        At ZeRO-0 the optimizer state is replicated and only rank 0 writes it; at ZeRO 1/2 every
        rank writes its own shard. The frozen base weights are never written. The driver then lists
        every file with its size and SHA-256 in the checkpoint's manifest (``roll_ma/checkpoint.py``),
        which resume checks before calling ``load_checkpoint``.
        """
        self._require_model()
        root = Path(ckpt_dir)
        if self.rank == 0:
            self.weights.save(root)
            if self.critic is not None:
                self.critic.save_heads(root)
        for name, updater in self._all_updaters().items():
            if updater.zero_stage > 0 or self.rank == 0:
                path = root / "optim" / name / f"rank{self.rank}.pt"
                path.parent.mkdir(parents=True, exist_ok=True)
                torch.save(updater.state_dict(), path)
        barrier()

    def load_checkpoint(self, ckpt_dir: str | os.PathLike) -> None:
        """Restore what ``save_checkpoint`` wrote (same ZeRO stage and number of ranks)."""
        self._require_model()
        root = Path(ckpt_dir)
        self.weights.load(root)
        if self.critic is not None:
            self.critic.load_heads(root)
        for name, updater in self._all_updaters().items():
            ranks = range(self.world_size) if updater.zero_stage > 0 else [0]
            files = [root / "optim" / name / f"rank{r}.pt" for r in ranks]
            missing = [str(f) for f in files if not f.exists()]
            if missing:
                raise FileNotFoundError(f"checkpoint {root} lacks optimizer states {missing}")
            updater.load_state_dict([torch.load(f, map_location="cpu", weights_only=False) for f in files])
        self.weights.activate(None)
        barrier()


if TYPE_CHECKING:  # mypy checks the class against the core and every capability it claims (the worker
    # calls it only through these Protocols)
    _conforms: type[TrainBackend] = MultiAgentDeepSpeedStrategy
    _phases: type[PhaseCapable] = MultiAgentDeepSpeedStrategy
    _dpo: type[DPOCapable] = MultiAgentDeepSpeedStrategy
    _joint_search: type[JointSearchCapable] = MultiAgentDeepSpeedStrategy
