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
- **The sync, actor side** is atgrpo_multilora_sync.MultiLoraSyncMixin, not here: the actor's
  engine (atgrpo_multilora.MultiLoraSyncEngine) needs it without this module's agent loop and replica.
"""

from __future__ import annotations

from typing import Any

from atgrpo_loop import RelayAgentLoop
from atgrpo_multilora_rollout import AGENT_LOOP, with_agent_lora
from verl.experimental.agent_loop.agent_loop import register
from verl.workers.rollout.replica import RolloutReplicaRegistry

__all__ = ["MultiLoraRelayAgentLoop", "load_multilora_replica"]

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
