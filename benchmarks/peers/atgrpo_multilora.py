"""PettingLLMs' ``lora`` regime on verl 0.9.1: an actor with one LoRA adapter and one optimizer per agent
(issue 60, stage 2, plan item 1; ported, not PettingLLMs' code).

- ``MultiLoraFSDPEngine`` is verl's FSDP/FSDP2 LM engine (workers/engine/fsdp/transformer_impl.py) with N
  adapters agent_0..agent_{N-1} on one base (verl builds its adapter ``default``; we add N copies of its
  config and drop it), one optimizer and one lr schedule per agent, and ``use_agent(k)``: the active adapter,
  and verl's own ``optimizer`` / ``lr_scheduler`` attributes pointed at agent k's. Every verl code path that
  steps, clips or schedules (``optimizer_step`` l. 788, ``lr_scheduler_step`` l. 836) then acts on agent k
  only. ``optimizer_zero_grad`` frees every agent's gradients (atgrpo_adapters.py says why; verl itself frees
  the active optimizer's on leaving train mode, engine/base.py:312, transformer_impl.py:1138).
- ``MultiLoraTrainingWorker`` is verl's TrainingWorker (workers/engine_workers.py:77) on that engine. Each
  row's agent is the batch's ``agent_id`` column (atgrpo_adapters.AGENT_COLUMN); ``infer_batch`` scores each
  agent's rows under its own adapter and returns them in row order, ``no_lora_adapter`` (verl's reference
  path when the reference is the actor with adapters off, trainer/ppo/v1/trainer_base.py:1703) scores every
  row on the base; ``train_mini_batch`` updates one agent at a time on its own rows, each with as many
  mini-batches as the whole batch would have had and the loss normalised over its own mini-batch
  (PettingLLMs calls update_actor once per agent on its sub-batch, multi_agents_ppo_trainer.py
  ~l. 568-600).
- ``MultiLoraActorRolloutRefWorker`` is verl's ActorRolloutRefWorker with that actor, through verl's own
  class attribute ``actor_worker_cls`` (engine_workers.py:460). The number of agents is
  ``actor_rollout_ref.model.lora.agents`` (HFModelConfig.lora is a free dict, workers/config/model.py:132).
- ``MultiLoraPPOTrainer`` (``trainer.v1.trainer_mode=atgrpo_multilora``) is verl's sync v1 trainer starting
  that worker; ``VERL_USE_EXTERNAL_MODULES=atgrpo_multilora`` registers it in verl's driver process.

Where verl 0.9.1 is in the way (lines of the 0.9.1 wheel; the smallest patch named):

- engine_workers.py:136-143: TrainingWorker builds its engine with ``EngineRegistry.new`` and offers no hook
  for the class. ``MultiLoraTrainingWorker`` lets verl build its engine (an unbuilt object: device mesh only,
  the model is built in ``reset``) and replaces it. Patch: an ``engine_cls`` class attribute.
- transformer_impl.py:217-223: one FSDPCheckpointManager with one optimizer and one scheduler, so
  save/load_checkpoint keeps only the active agent's optimizer state (the module's state_dict has every
  adapter). Patch: one checkpoint manager per agent, or a manager taking a list of optimizers. Not done here.
- transformer_impl.py:1001 (``get_per_tensor_param``) exports the adapter named ``default``.
  ``MultiLoraFSDPEngine`` exports the base through verl's code (agent 0's LoraConfig aliased as ``default``
  for the call) and refuses the one-LoRA export; ``MultiLoraSyncEngine``, the engine the worker builds, adds
  atgrpo_multilora_sync's export of every agent's LoRA, which verl's ``update_weights``
  (engine_workers.py:785-823) sends and atgrpo_multilora_vllm.py loads one vLLM LoRA id per agent.
- With data parallelism every rank must hold the same number of rows of each agent (FSDP's collectives run
  once per agent's sub-batch); ``_check_same_agent_rows`` raises where they differ instead of hanging.
"""

from __future__ import annotations

import copy

import ray
import torch
from atgrpo_adapters import (
    AGENT_COLUMN,
    TEMPLATE_ADAPTER,
    adapter_name,
    add_agent_adapters,
    agent_parameters,
    build_agent_optimizers,
    free_gradients,
    in_row_order,
    rows_by_agent,
    set_agent_adapter,
)
from atgrpo_multilora_sync import MultiLoraSyncMixin
from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn, register
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils import tensordict_utils as tu
from verl.utils.fsdp_utils import load_fsdp_optimizer, offload_fsdp_optimizer
from verl.utils.tensordict_utils import nested_tensor_from_tensor_list
from verl.workers.config.optimizer import build_optimizer
from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead
from verl.workers.engine_workers import ActorRolloutRefWorker, TrainingWorker

# actor_rollout_ref.model.lora.<AGENTS_KEY>: how many agents (adapters) the actor holds.
AGENTS_KEY = "agents"
# trainer.v1.trainer_mode: verl's sync v1 trainer with the multi-LoRA actor
TRAINER_MODE = "atgrpo_multilora"


def agents_of(model_config) -> int:
    agents = int((model_config.lora or {}).get(AGENTS_KEY, 0))
    if agents < 1:
        raise ValueError(f"model.lora.{AGENTS_KEY} must be >= 1 for the multi-LoRA actor, got {agents}")
    if model_config.lora_rank <= 0:
        raise ValueError("the multi-LoRA actor needs model.lora_rank > 0")
    if model_config.lora.get("merge", False):
        raise ValueError(
            "model.lora.merge=True merges one adapter into the base; one adapter per agent can't"
        )
    if getattr(model_config, "lora_adapter_path", None):
        raise ValueError(
            "model.lora_adapter_path loads one adapter; the multi-LoRA actor starts N fresh ones"
        )
    return agents


class MultiLoraFSDPEngine(FSDPEngineWithLMHead):
    """verl's FSDP LM engine holding one LoRA adapter, one optimizer and one lr schedule per agent."""

    def __init__(self, model_config, engine_config, optimizer_config, checkpoint_config, agents: int):
        super().__init__(model_config, engine_config, optimizer_config, checkpoint_config)
        self.agents = agents
        self.agent_optimizers: list = []  # [agent] torch optimizer over agent's LoRA parameters only
        self.agent_lr_schedulers: list = []  # [agent] its lr schedule, stepped only by its own updates
        self.active_agent = 0

    # ---- building (verl's _build_model_optimizer calls these, transformer_impl.py:588-627)
    def _build_lora_module(self, module):
        module = super()._build_lora_module(module)  # verl's adapter 'default', verl's LoraConfig
        add_agent_adapters(module, self.agents)
        # verl casts its adapter to the base dtype for FSDP's flat groups (l. 371-381); the new ones likewise
        base_dtype = next((p.dtype for n, p in module.named_parameters() if "lora_" not in n), None)
        for name, param in module.named_parameters():
            if "lora_" in name and base_dtype is not None and param.dtype != base_dtype:
                param.data = param.data.to(base_dtype)
        return module

    def _build_optimizer(self, module):
        self.agent_optimizers = build_agent_optimizers(
            module, self.agents, lambda params: build_optimizer(params, self.optimizer_config)
        )
        return self.agent_optimizers[0]

    def _build_lr_scheduler(self, optimizer):
        self.agent_lr_schedulers = []
        for agent_optimizer in self.agent_optimizers:
            self.agent_lr_schedulers.append(super()._build_lr_scheduler(agent_optimizer))
        return self.agent_lr_schedulers[0]

    # ---- the active agent
    def use_agent(self, agent_id: int) -> None:
        """Forwards run under agent ``agent_id``'s adapter; verl steps, clips, schedules its optimizer."""
        if not 0 <= agent_id < self.agents:
            raise ValueError(f"agent {agent_id} outside 0..{self.agents - 1}")
        set_agent_adapter(self.module, agent_id)
        if self.agent_optimizers:  # a forward-only engine has none
            self.optimizer = self.agent_optimizers[agent_id]
            self.lr_scheduler = self.agent_lr_schedulers[agent_id]
        self.active_agent = agent_id

    def optimizer_zero_grad(self):
        free_gradients(self.agent_optimizers)

    def to(self, device: str, model: bool = True, optimizer: bool = True, grad: bool = True):
        super().to(device, model=model, optimizer=optimizer, grad=grad)  # the model and the active optimizer
        if not optimizer or self.engine_config.forward_only:
            return
        for agent_id, other in enumerate(self.agent_optimizers):  # the other agents' optimizer states
            if agent_id == self.active_agent:
                continue
            if device == "cpu":
                offload_fsdp_optimizer(other)
            else:
                load_fsdp_optimizer(other, device)

    def agent_state(self, agent_id: int) -> dict[str, torch.Tensor]:
        """Agent ``agent_id``'s LoRA parameters as the module names them (``...lora_A.agent_1.weight``),
        full tensors, copied."""
        return {name: _full(p).clone() for name, p in agent_parameters(self.module, agent_id)}

    # ---- the weight sync's export (plan item 2 sends it; verl's own export names one adapter)
    def agent_lora_params(self, agent_id: int) -> tuple[dict[str, torch.Tensor], dict]:
        """Agent ``agent_id``'s LoRA as verl's export hands its one adapter to vLLM when the base is already
        there (transformer_impl.py:1001-1004, 1025-1026: peft's adapter state dict, the adapter's name left
        out of the keys, full tensors; and its LoraConfig as a dict, l. 1060), for a TensorLoRARequest of
        that agent's own id."""
        from peft.utils.save_and_load import get_peft_model_state_dict
        from verl.utils.model import convert_weight_keys

        name = adapter_name(agent_id)
        state = get_peft_model_state_dict(self.module, adapter_name=name)
        state = convert_weight_keys(
            state, getattr(self.module, "_fsdp_wrapped_module", self.module)
        )  # l. 1018
        return {k: _full(v).detach().cpu() for k, v in state.items()}, self.module.peft_config[name].to_dict()

    def get_per_tensor_param(self, layered_summon=False, base_sync_done=False, **kwargs):
        """verl's export reads the adapter named ``default`` (l. 1001). The base weights (``base_sync_done``
        False: the LoRA parameters left out) are every agent's: verl's export as it is, under agent 0's
        LoraConfig (all agents share it). One LoRA for all agents does not exist: that call is refused, the
        agents' LoRAs are ``agent_lora_params``."""
        if base_sync_done:
            raise NotImplementedError(
                "one LoRA per agent: export each with agent_lora_params(agent_id) (issue 60 plan item 2)"
            )
        configs = self.module.peft_config
        configs[TEMPLATE_ADAPTER] = configs[adapter_name(0)]
        try:
            return super().get_per_tensor_param(layered_summon=layered_summon, base_sync_done=False, **kwargs)
        finally:
            del configs[TEMPLATE_ADAPTER]


class MultiLoraSyncEngine(MultiLoraSyncMixin, MultiLoraFSDPEngine):
    """The engine the multi-LoRA actor runs: MultiLoraFSDPEngine, whose adapter export (the weight sync's
    LoRA half, refused there) is every agent's adapter in one stream (atgrpo_multilora_sync.py)."""


def _full(t: torch.Tensor) -> torch.Tensor:
    """An FSDP2 parameter's whole tensor (a DTensor's all-gather); a plain tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _check_same_agent_rows(engine, rows: dict[int, torch.Tensor]) -> None:
    """Every data-parallel rank runs one forward/backward per agent present: their agents and row counts
    must agree, or FSDP's collectives would wait on each other for ever."""
    group = engine.get_data_parallel_group()
    if torch.distributed.get_world_size(group) == 1:
        return
    mine = {k: len(v) for k, v in rows.items()}
    everyone: list = [None] * torch.distributed.get_world_size(group)
    torch.distributed.all_gather_object(everyone, mine, group=group)
    if any(counts != mine for counts in everyone):
        raise ValueError(f"rows per agent differ across data-parallel ranks: {everyone}")


def _merge_metrics(per_agent: dict[int, dict]) -> dict:
    """Each key's values over all agents (verl's trainer reads keys like ``mfu`` as they are), and each
    agent's own under ``agent_{k}/``."""
    merged: dict = {}
    for agent_id, metrics in per_agent.items():
        for key, value in metrics.items():
            merged[f"{adapter_name(agent_id)}/{key}"] = value
            if key not in merged:
                merged[key] = copy.deepcopy(value) if hasattr(value, "extend") else [value]
            elif hasattr(merged[key], "extend") and hasattr(value, "extend"):
                merged[key].extend(value)
            else:
                merged[key].append(value)
    return merged


def _select_rows(data, rows: torch.Tensor):
    """verl's row selection, plus the per-row ``global_token_num`` list (kept whole by verl's selection)."""
    part = tu.index_select_tensor_dict(data, rows)
    tokens = tu.get(data, key="global_token_num", default=None)
    if isinstance(tokens, list) and len(tokens) == len(data):
        tu.assign_non_tensor(part, global_token_num=[tokens[i] for i in rows.tolist()])
    return part


class MultiLoraTrainingWorker(TrainingWorker):
    """verl's TrainingWorker on ``MultiLoraFSDPEngine``: each row scored and trained under its agent's
    LoRA."""

    engine_cls = MultiLoraSyncEngine  # the class verl's engine object is replaced by

    def __init__(self, config):
        super().__init__(config)  # builds verl's engine object (not the model: that is reset()'s job)
        if not isinstance(self.engine, FSDPEngineWithLMHead):
            raise ValueError(
                f"the multi-LoRA actor runs on verl's FSDP LM engine, not {type(self.engine).__name__}"
            )
        self.engine = self.engine_cls(
            model_config=self.model_config,
            engine_config=self.engine_config,
            optimizer_config=self.optimizer_config,
            checkpoint_config=self.checkpoint_config,
            agents=agents_of(self.model_config),
        )

    def _rows(self, data) -> dict[int, torch.Tensor]:
        if AGENT_COLUMN not in data.keys():
            raise ValueError(f"the multi-LoRA actor needs the batch's {AGENT_COLUMN!r} column (B,)")
        rows = rows_by_agent(data[AGENT_COLUMN], self.engine.agents)
        _check_same_agent_rows(self.engine, rows)
        return rows

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False)
    def infer_batch(self, data):
        if tu.get(data, key="no_lora_adapter", default=False):
            return super().infer_batch(data)  # the reference: verl disables every adapter (l. 425)
        parts = {}
        for agent_id, rows in self._rows(data).items():
            self.engine.use_agent(agent_id)
            parts[agent_id] = (rows, super().infer_batch(_select_rows(data, rows)))
        if not self.engine.is_mp_src_rank_with_outputs():
            return None
        return self._in_row_order(parts, len(data))

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn(mesh_name="train"), blocking=False)
    def train_mini_batch(self, data):
        batch_size = len(data)
        mini_batch_size = tu.pop(data, key="mini_batch_size", default=None)
        num_mini_batch = tu.pop(data, key="num_mini_batch", default=None)
        if mini_batch_size is not None:  # as verl counts it (engine_workers.py:263-268): rows over all ranks
            num_mini_batch = batch_size // (mini_batch_size // self.engine.get_data_parallel_size())
        if not num_mini_batch:
            raise ValueError("train_mini_batch needs mini_batch_size or num_mini_batch")
        outputs = {}
        for agent_id, rows in self._rows(data).items():
            if len(rows) % num_mini_batch:
                raise ValueError(
                    f"agent {agent_id}: {len(rows)} rows do not split into {num_mini_batch} mini-batches"
                )
            part = _select_rows(data, rows)
            tu.assign_non_tensor(part, num_mini_batch=num_mini_batch)
            if tu.get(data, key="global_batch_size", default=None) is not None:
                # verl's seq-mean losses divide by the mini-batch's rows over all ranks
                # (core_algos.py:1188); agent k's mini-batch is its own rows, as in an update of it alone
                dp_size = self.engine.get_data_parallel_size()
                tu.assign_non_tensor(part, global_batch_size=len(rows) // num_mini_batch * dp_size)
            self.engine.use_agent(agent_id)
            outputs[agent_id] = super().train_mini_batch(part)
        if not self.engine.is_mp_src_rank_with_outputs():
            return None
        metrics = _merge_metrics({k: tu.get(out, "metrics") for k, out in outputs.items()})
        return tu.get_tensordict(tensor_dict={}, non_tensor_dict={"metrics": metrics}).cpu()

    def _in_row_order(self, parts: dict, batch_size: int):
        """One TensorDict of the agents' outputs, rows in the batch's order; metrics merged."""
        first = next(iter(parts.values()))[1]
        tensors = {}
        for key, value in first.items():
            if key == "metrics" or not isinstance(value, torch.Tensor):
                continue
            per_row = in_row_order(
                [(rows, list(out[key].unbind())) for rows, out in parts.values()], batch_size
            )
            tensors[key] = (
                nested_tensor_from_tensor_list(per_row) if value.is_nested else torch.stack(per_row)
            )
        metrics = _merge_metrics({k: tu.get(out, "metrics") for k, (_, out) in parts.items()})
        return tu.get_tensordict(tensor_dict=tensors, non_tensor_dict={"metrics": metrics})


class MultiLoraActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's actor/rollout/ref worker whose actor is ``MultiLoraTrainingWorker`` (verl's own hook)."""

    actor_worker_cls = MultiLoraTrainingWorker


@register_trainer(TRAINER_MODE)
class MultiLoraPPOTrainer(PPOTrainerSync):
    """verl's sync v1 trainer (``trainer.v1.trainer_mode=sync``) whose actor worker is the multi-LoRA one; the
    swap is verl's own pattern (trainer/ppo/v1/trainer_separate_async.py:114-126). The actor worker class is
    fixed at trainer_base.py:805 (``ray.remote(ActorRolloutRefWorker)``). main_ppo looks the mode up in the
    process that runs it (main_ppo.py:141), so this module must be imported there: verl imports the modules
    named in ``VERL_USE_EXTERNAL_MODULES`` on its own import (verl/__init__.py:49-52)."""

    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        for role in (Role.Actor, Role.ActorRollout, Role.ActorRolloutRef):
            if role in self.role_worker_mapping:
                self.role_worker_mapping[role] = ray.remote(MultiLoraActorRolloutRefWorker)
