"""The actor's half of the weight sync with one LoRA per agent (issue 60, stage 2, plan item 2): the FSDP
engine's adapter export. Lines are the verl 0.9.1 wheel's, under verl/.

verl's FSDP engine exports the adapter named ``default`` only (workers/engine/fsdp/
transformer_impl.py:999-1008: ``peft_config.get("default")``, peft's get_peft_model_state_dict of
``default``), which the multi-LoRA actor no longer has. ``MultiLoraSyncMixin.get_per_tensor_param``, put
before atgrpo_multilora.MultiLoraFSDPEngine in an engine class's bases (atgrpo_multilora.MultiLoraSyncEngine),
exports the adapters (``base_sync_done`` True, which that engine alone refuses): every agent's under its
multi-adapter names, in one stream, with the agents' shared config. verl's worker
(workers/engine_workers.py:786-806) then takes its LoRA path unchanged (the adapter sync, sleep level 1), and
the vLLM workers split the tensors per agent (atgrpo_multilora_vllm.MultiLoraWorkerExtension). One stream, not
one sync per agent: verl's worker asks the engine once, and its vLLM call carries no agent. The base export
(``base_sync_done`` False: vLLM started on dummy weights) stays the engine's own. Refused: ``layered_summon``
and ``lora.merge``.

Its own module, below both the actor (atgrpo_multilora) and the rollout glue (atgrpo_multilora_verl): the
actor's processes need it, but neither vLLM nor the agent loop, and the glue must not import the actor.
"""

from __future__ import annotations

from typing import Any

from atgrpo_multilora_rollout import agent_adapter_tensors, agent_peft_config
from verl.utils.fsdp_utils import load_fsdp_model_to_gpu, offload_fsdp_model_to_cpu
from verl.utils.model import convert_weight_keys


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
