"""verl 0.9.1's vLLM server and weight sync with one LoRA per agent (issue 60, stage 2, plan item 2). Needs
vLLM: atgrpo_multilora_verl.py loads it only where verl makes its rollout replicas. The ids, the request tag
and the tensor split it uses are atgrpo_multilora_rollout.py's.

What each class replaces (lines of the verl 0.9.1 wheel, under verl/workers/rollout/vllm_rollout/):

- ``MultiLoraReplica`` (a vLLMReplica, vllm_async_server.py:1320): only its server class, set at l. 1334
  (``self.server_class = ray.remote(vLLMHttpServer)``), is ``MultiLoraHttpServer``.
- ``MultiLoraHttpServer`` (a vLLMHttpServer, l. 87):
  - ``max_loras``: launch_server writes ``max_loras: 1`` into the engine args after the user's
    engine_kwargs (l. 427-435), so no config reaches it. The parsed args come to ``run_server`` /
    ``run_headless`` (l. 476-479); the override sets ``max_loras`` = the number of agents there
    (``actor_rollout_ref.model.lora.agents``) and calls verl's.
  - the LoRA of a request: generate builds ``LoRARequest(123)`` where LoRA 123 is loaded, else None
    (l. 652-660), and passes it to ``self.engine.generate`` (l. 667-673). After verl's run_server has made
    its engine, ``self.engine`` is wrapped in ``AgentLoraEngine``: its ``generate`` replaces that
    lora_request with the one the request's SamplingParams.extra_args names (the agent loop's tag); every
    other engine call goes to vLLM's engine as it is.
  - the worker extension: ``_get_worker_extension_cls`` (l. 1273, verl's hook for it) names
    ``MultiLoraWorkerExtension``.
- ``MultiLoraWorkerExtension`` (a vLLMColocateWorkerExtension, utils.py:136): ``_update_weights`` (l. 367)
  builds one ``TensorLoRARequest`` under id 123 from all the LoRA tensors of a sync (verl hands it the whole
  sync at once, l. 302-317). The override splits them per agent, and for each agent removes that agent's
  LoRA id and adds its new tensors under it (vLLM's add_lora keeps an id's old tensors where the id is
  loaded already, which is why verl removes 123 first, l. 283; that removal stays, a no-op here). Base
  weights (no peft_config, or the base sync) go to verl's code as they are.

Not run (no working vLLM in verl's CPU venv): anything inside vLLM. The CPU tests run this module against
verl's real classes with vLLM's modules stubbed: the args override; verl's own ``generate`` on this server,
the tagged dict reaching the engine call with the agent's LoRA; a whole sync through verl's bucketed transfer
(shared memory) and verl's ``update_weights_from_ipc`` into the per-agent remove/add; and, where vLLM 0.32
imports (the project's venv), vLLM's own LoRA loader building each agent's adapter from the split tensors.
Open on a GPU: vLLM 0.25 serving N adapters at once (``max_loras`` = N; ``max_cpu_loras`` defaults to it, so
no adapter is evicted: an evicted one would be reloaded from verl's placeholder path and fail), verl's
hijacked ``_load_adapter`` (verl/utils/vllm/utils.py:39) taking each agent's TensorLoRARequest, and vLLM's
worker importing this module as its extension (the PYTHONPATH that reaches verl's Ray actors).
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncGenerator
from typing import Any

import ray
import torch
from atgrpo_multilora_rollout import (
    AGENTS_KEY,
    lora_for_request,
    lora_int_id,
    max_loras,
    requested_lora_int_id,
    split_agent_adapters,
)
from verl.utils.vllm import TensorLoRARequest
from verl.workers.rollout.vllm_rollout.utils import VLLM_LORA_PATH, vLLMColocateWorkerExtension
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica
from vllm.lora.request import LoRARequest


def agent_lora_request(lora_id: int) -> LoRARequest:
    """A request's LoRA: the adapter loaded under ``lora_id`` (name and path as the sync registered it)."""
    return LoRARequest(lora_name=str(lora_id), lora_int_id=lora_id, lora_path=VLLM_LORA_PATH)


class AgentLoraEngine:
    """vLLM's engine client, with each generate request on the LoRA its sampling params name."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def __getattr__(self, name: str) -> Any:  # sleep, wake_up, list_loras, collective_rpc...: vLLM's own
        return getattr(self.engine, name)

    async def generate(
        self, *args: Any, sampling_params: Any, lora_request: Any = None, **kwargs: Any
    ) -> AsyncGenerator:
        requested = requested_lora_int_id(sampling_params.extra_args)
        if requested is not None:  # no tag: verl's own choice stands (LoRA 123 or none)
            lora_id = lora_for_request(requested, await self.engine.list_loras())
            lora_request = None if lora_id is None else agent_lora_request(lora_id)
        async for output in self.engine.generate(
            *args, sampling_params=sampling_params, lora_request=lora_request, **kwargs
        ):
            yield output


class MultiLoraWorkerExtension(vLLMColocateWorkerExtension):
    """verl's vLLM worker extension, the LoRA sync pushing each agent's adapter under its own LoRA id."""

    def _update_weights(
        self, weights: list[tuple[str, torch.Tensor]], peft_config: dict, base_sync_done: bool
    ):
        if not (peft_config and base_sync_done):
            return super()._update_weights(weights, peft_config=peft_config, base_sync_done=base_sync_done)
        for agent_id, tensors in split_agent_adapters(weights).items():
            lora_id = lora_int_id(agent_id)
            self.remove_lora(lora_id)  # else add_lora keeps the id's old tensors
            self.add_lora(
                TensorLoRARequest(
                    lora_name=str(lora_id),
                    lora_int_id=lora_id,
                    lora_path=VLLM_LORA_PATH,
                    peft_config=peft_config,
                    # clones: add_lora keeps them past the reused receive buffer (as verl, utils.py:373)
                    lora_tensors={name: tensor.clone() for name, tensor in tensors.items()},
                )
            )


class MultiLoraHttpServer(vLLMHttpServer):
    """verl's vLLM server with ``max_loras`` = agents and each request on its agent's LoRA."""

    def agents(self) -> int:
        agents = self.model_config.lora.get(AGENTS_KEY)
        if agents is None:
            raise ValueError(f"actor_rollout_ref.model.lora.{AGENTS_KEY} is not set (the number of agents)")
        return int(agents)

    def _set_max_loras(self, args: argparse.Namespace) -> None:
        if not self.lora_as_adapter:
            raise ValueError("one LoRA per agent needs LoRA adapters (model.lora_rank > 0, lora.merge off)")
        args.max_loras = max_loras(self.agents())

    async def run_server(self, args: argparse.Namespace):
        self._set_max_loras(args)
        await super().run_server(args)
        self.engine = AgentLoraEngine(self.engine)

    async def run_headless(self, args: argparse.Namespace):
        self._set_max_loras(args)
        await super().run_headless(args)

    def _get_worker_extension_cls(self) -> str:
        return f"{MultiLoraWorkerExtension.__module__}.{MultiLoraWorkerExtension.__qualname__}"


# A module-level actor class, as atgrpo_loop.RelayAgentLoopWorker is (a class wrapped with ray.remote at run
# time reaches its actor by value, and super() calls in it then fail).
MultiLoraHttpServerActor = ray.remote(MultiLoraHttpServer)


class MultiLoraReplica(vLLMReplica):
    """verl's vLLM replica serving through MultiLoraHttpServer."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_class = MultiLoraHttpServerActor
