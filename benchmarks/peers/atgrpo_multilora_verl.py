"""The verl 0.9.1 side of one vLLM LoRA per agent (issue 60, stage 2, plan item 2), without vLLM: importing
this module (``actor_rollout_ref.model.external_lib``, see atgrpo_multilora_rollout.multilora_overrides)
installs the multi-LoRA vLLM replica, and it holds the agent loop that sends each turn on its seat's LoRA and
the actor engine's half of the weight sync. Lines are the verl 0.9.1 wheel's, under verl/.

- **The replica.** verl's LLM server manager picks its replica class by rollout name from
  ``RolloutReplicaRegistry`` (workers/rollout/llm_server.py:393, workers/rollout/replica.py:312-327, a
  registry of loaders verl documents for new rollout types). Importing this module registers, under
  ``vllm``, a loader of atgrpo_multilora_vllm.MultiLoraReplica in place of verl's ``_load_vllm``
  (replica.py:331). The name stays ``vllm``: verl checks it elsewhere (the request priority,
  llm_server.py:144; the actor's rollout adapter class). The task runner imports this module when it first
  builds the model config (trainer/ppo/v1/trainer_base.py:703, ``_init_tokenizer``, the first step of
  ``_setup``), before its LLM server manager makes the replicas (l. 372).
- **The requests.** ``MultiLoraRelayAgentLoop`` is stage 1's relay loop (atgrpo_loop.RelayAgentLoop) with each
  turn's sampling params naming the acting seat's LoRA id (atgrpo_multilora_rollout.with_agent_lora);
  agent = seat. Registered as ``atgrpo_relay_multilora`` in each agent-loop worker, which imports this module
  when it builds its model config (experimental/agent_loop/agent_loop.py:505).
- **The sync, actor side.** verl's FSDP engine exports the adapter named ``default`` only
  (workers/engine/fsdp/transformer_impl.py:999-1008: ``peft_config.get("default")``, peft's
  get_peft_model_state_dict of ``default``), which the multi-LoRA actor no longer has.
  ``MultiLoraSyncMixin.get_per_tensor_param``, put before atgrpo_multilora.MultiLoraFSDPEngine in an engine
  class's bases, exports the adapters (``base_sync_done`` True, which that engine refuses): every agent's
  under its multi-adapter names, in one stream, with the agents' shared config. verl's worker
  (workers/engine_workers.py:786-806) then takes its LoRA path unchanged (the adapter sync, sleep level 1),
  and the vLLM workers split the tensors per agent (atgrpo_multilora_vllm.MultiLoraWorkerExtension). One
  stream, not one sync per agent: verl's worker asks the engine once, and its vLLM call carries no agent.
  The base export (``base_sync_done`` False: vLLM started on dummy weights) stays the engine's own.
  Refused: ``layered_summon`` and ``lora.merge``.
"""

from __future__ import annotations

from typing import Any

from atgrpo_loop import RelayAgentLoop
from atgrpo_multilora_rollout import (
    AGENT_LOOP,
    agent_adapter_tensors,
    agent_peft_config,
    with_agent_lora,
)
from verl.experimental.agent_loop.agent_loop import register
from verl.utils.fsdp_utils import load_fsdp_model_to_gpu, offload_fsdp_model_to_cpu
from verl.utils.model import convert_weight_keys
from verl.workers.rollout.replica import RolloutReplicaRegistry

ROLLOUT_NAME = "vllm"  # the rollout name whose replica class this module replaces


def load_multilora_replica() -> type:
    """The registry's loader: imported only where a replica is made (the task runner), vLLM there."""
    from atgrpo_multilora_vllm import MultiLoraReplica

    return MultiLoraReplica


RolloutReplicaRegistry.register(ROLLOUT_NAME, load_multilora_replica)


@register(AGENT_LOOP)
class MultiLoraRelayAgentLoop(RelayAgentLoop):
    """The relay agent loop with each seat's turn generated under that seat's own LoRA."""

    def turn_sampling_params(self, sampling_params: dict[str, Any], seat: int) -> dict[str, Any]:
        return with_agent_lora(sampling_params, seat)


class MultiLoraSyncMixin:
    """An FSDP engine's adapter export for the rollout with one adapter per agent (``self.agents`` of them,
    atgrpo_multilora.MultiLoraFSDPEngine's), in place of the LoRA branch of verl's
    FSDPEngine.get_per_tensor_param (transformer_impl.py:977-1026 with ``base_sync_done``)."""

    agents: int

    def get_per_tensor_param(self, layered_summon: bool = False, base_sync_done: bool = False, **kwargs: Any):
        if not base_sync_done:  # the base weights: the engine's (atgrpo_multilora.MultiLoraFSDPEngine's)
            return super().get_per_tensor_param(layered_summon=layered_summon, base_sync_done=False, **kwargs)
        if layered_summon:
            raise ValueError("rollout.layered_summon is not supported with one LoRA per agent")
        if self.model_config.lora.get("merge", False):
            raise ValueError("model.lora.merge cannot serve one LoRA per agent (one merged model)")
        # staged as verl stages a PEFT model (transformer_impl.py:988-991, 1021-1022): full_tensor all-gathers
        if not self._uses_fsdp2_cpu_offload_policy:
            load_fsdp_model_to_gpu(self.module)
        peft_model = getattr(self.module, "_fsdp_wrapped_module", self.module)
        tensors = convert_weight_keys(agent_adapter_tensors(peft_model, self.agents), peft_model)
        if self._is_offload_param:
            offload_fsdp_model_to_cpu(self.module)
        return tensors.items(), agent_peft_config(peft_model, self.agents)
