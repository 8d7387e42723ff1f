"""One vLLM LoRA per agent for PettingLLMs' ``lora`` regime on verl 0.9.1 (issue 60, stage 2, plan item 2):
which LoRA id an agent's adapter has in vLLM, how a generate request names it, how the actor's
multi-adapter PEFT tensors are collected and split into one vLLM adapter per agent, and the overrides that
turn it on. No verl and no vLLM here (torch only; peft is only read through the model it is given), so all of
it is tested on CPU in any venv.

- **Ids.** Agent k's adapter (PEFT adapter ``agent_k``, as atgrpo_adapters.adapter_name names it) is vLLM LoRA
  ``LORA_INT_ID_BASE + k``. verl's one-LoRA path uses the fixed id 123 (verl/workers/rollout/vllm_rollout/
  utils.py:40) and its weight sync still calls ``remove_lora(123)`` first (utils.py:283); ids from 1000 up
  never meet it.
- **Requests.** The agent loop puts the acting agent's LoRA id in the request's sampling params, under
  ``extra_args`` (vLLM's SamplingParams field for data its own samplers ignore). verl passes the dict through
  unchanged from the agent loop to the server (workers/rollout/llm_server.py:150, vllm_async_server.py:634
  ``SamplingParams(**sampling_params)``), where atgrpo_multilora_vllm.py reads it back.
- **Tensors.** A multi-adapter PEFT model names agent k's weights ``<module>.lora_A.agent_k.weight``; vLLM's
  tensor loader takes one adapter with PEFT's single-adapter names (``<module>.lora_A.weight``, what
  peft's ``get_peft_model_state_dict`` writes and verl sends for its one adapter). The actor sends every
  agent's tensors under their multi-adapter names (unique, so verl's buckets can carry them together); the
  vLLM worker splits them per agent and drops the adapter name.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import torch

ADAPTER_PREFIX = "agent_"  # PEFT adapter of agent k: agent_k (the same names as atgrpo_adapters.adapter_name)
LORA_INT_ID_BASE = 1000  # vLLM LoRA id of agent k: 1000 + k (never verl's 123; vLLM needs ids > 0)
LORA_ID_ARG = "atgrpo_lora_int_id"  # the key in a request's sampling_params["extra_args"]
AGENTS_KEY = "agents"  # actor_rollout_ref.model.lora.<AGENTS_KEY>: how many agents (as atgrpo_multilora.py)
AGENT_LOOP = "atgrpo_relay_multilora"  # actor_rollout_ref.rollout.agent.default_agent_loop
VERL_GLUE_MODULE = "atgrpo_multilora_verl"  # actor_rollout_ref.model.external_lib

# A LoRA tensor of a multi-adapter PEFT model: <module>.<lora part>.<adapter>[.weight|.bias]. The embedding
# parts are parameters themselves (no .weight).
_ADAPTER_TENSOR = re.compile(
    r"^(?P<module>.+)\.(?P<part>lora_A|lora_B|lora_embedding_A|lora_embedding_B)\.(?P<adapter>[^.]+)"
    r"(?P<tail>\.weight|\.bias)?$"
)


def adapter_name(agent_id: int) -> str:
    return f"{ADAPTER_PREFIX}{agent_id}"


def lora_int_id(agent_id: int) -> int:
    """vLLM's LoRA id of agent ``agent_id``'s adapter."""
    if agent_id < 0:
        raise ValueError(f"agent ids start at 0, got {agent_id}")
    return LORA_INT_ID_BASE + agent_id


def agent_of_lora(lora_id: int) -> int:
    """The agent whose adapter is vLLM LoRA ``lora_id`` (the inverse of lora_int_id)."""
    if lora_id < LORA_INT_ID_BASE:
        raise ValueError(f"LoRA id {lora_id} is no agent's (agents' ids start at {LORA_INT_ID_BASE})")
    return lora_id - LORA_INT_ID_BASE


def with_agent_lora(sampling_params: Mapping[str, Any], agent_id: int) -> dict[str, Any]:
    """A copy of a request's sampling params that asks for agent ``agent_id``'s LoRA (the caller's dict is
    left as it is: verl hands one dict to every turn of a session)."""
    extra_args = dict(sampling_params.get("extra_args") or {})
    extra_args[LORA_ID_ARG] = lora_int_id(agent_id)
    return {**sampling_params, "extra_args": extra_args}


def requested_lora_int_id(extra_args: Mapping[str, Any] | None) -> int | None:
    """The LoRA id a request's SamplingParams.extra_args asks for; None where it names none."""
    if not extra_args or LORA_ID_ARG not in extra_args:
        return None
    return int(extra_args[LORA_ID_ARG])


def lora_for_request(requested: int | None, loaded: Iterable[int]) -> int | None:
    """The LoRA id a request runs under, given the ids vLLM has loaded. Before the first weight sync no
    agent's adapter is loaded and the request runs on the base model, as verl's one-LoRA server does
    (vllm_async_server.py:654-660); once any agent's adapter is loaded, a request whose agent's adapter is
    missing is a broken sync and raises instead of quietly sampling from the base."""
    if requested is None:
        return None
    agent_ids = {i for i in loaded if i >= LORA_INT_ID_BASE}
    if requested in agent_ids:
        return requested
    if not agent_ids:
        return None
    agent = agent_of_lora(requested)
    raise RuntimeError(f"LoRA {requested} (agent {agent}) is not loaded in vLLM; loaded: {sorted(agent_ids)}")


def max_loras(agents: int) -> int:
    """vLLM's ``max_loras`` (adapters resident on the GPU in one batch): every agent acts in every step, and a
    batch holds turns of different agents, so all N must fit."""
    if agents < 1:
        raise ValueError(f"agents must be >= 1, got {agents}")
    return agents


def split_agent_adapters(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
) -> dict[int, dict[str, torch.Tensor]]:
    """Multi-adapter PEFT LoRA tensors -> {agent: {single-adapter name: tensor}}, in agent order.

    ``...q_proj.lora_A.agent_2.weight`` becomes agent 2's ``...q_proj.lora_A.weight``. A tensor that is no
    agent adapter's LoRA weight (a base weight, verl's ``default`` adapter) raises: the sync must push
    exactly the agents' adapters, and a stray name would otherwise be dropped without a word."""
    per_agent: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in named_tensors:
        match = _ADAPTER_TENSOR.match(name)
        adapter = match["adapter"] if match else ""
        agent = adapter[len(ADAPTER_PREFIX) :]
        if not (adapter.startswith(ADAPTER_PREFIX) and agent.isdigit()):
            raise ValueError(
                f"{name!r} is not an agent adapter's LoRA tensor (<module>.lora_A.agent_<k>.weight)"
            )
        single_name = f"{match['module']}.{match['part']}{match['tail'] or ''}"
        tensors = per_agent.setdefault(int(agent), {})
        if single_name in tensors:
            raise ValueError(f"two tensors of agent {agent} are named {single_name!r}")
        tensors[single_name] = tensor
    return dict(sorted(per_agent.items()))


def agent_adapter_tensors(peft_model: torch.nn.Module, agents: int) -> OrderedDict[str, torch.Tensor]:
    """Every agent's LoRA tensors of ``peft_model`` (a PEFT model with adapters agent_0 .. agent_{N-1}), full
    tensors on the CPU under their multi-adapter names, as the actor's weight sync sends them.

    From the model's state_dict, as peft's get_peft_model_state_dict (which verl's one-adapter sync calls,
    verl/utils/fsdp_utils.py:743) reads it; FSDP2 gives DTensors there and ``full_tensor`` all-gathers each
    (every rank must call this, in the same order, as with verl's). Raises where an agent has no tensors."""
    tensors: OrderedDict[str, torch.Tensor] = OrderedDict()
    for name, value in peft_model.state_dict().items():
        match = _ADAPTER_TENSOR.match(name)
        if match and match["adapter"].startswith(ADAPTER_PREFIX):
            full = value.full_tensor() if hasattr(value, "full_tensor") else value
            tensors[name] = full.detach().cpu()
    present = split_agent_adapters(tensors.items()).keys()
    missing = sorted(set(range(agents)) - set(present))
    extra = sorted(set(present) - set(range(agents)))
    if missing or extra:
        raise ValueError(
            f"adapters of agents 0..{agents - 1} expected; missing {missing}, unexpected {extra}"
        )
    return tensors


def agent_peft_config(peft_model: torch.nn.Module, agents: int) -> dict[str, Any]:
    """The one LoRA config every agent's adapter has, as a dict (verl passes ``peft_config.to_dict()`` to the
    vLLM worker, transformer_impl.py:1060, which builds vLLM's PEFTHelper from it). verl's sync carries one
    config for all the tensors it sends, so the agents' configs must be the same (atgrpo_adapters copies one
    template for all); a difference raises."""
    configs = [peft_model.peft_config[adapter_name(k)].to_dict() for k in range(agents)]
    for k, config in enumerate(configs[1:], start=1):
        if config != configs[0]:
            differ = sorted(
                key for key in config.keys() | configs[0].keys() if config.get(key) != configs[0].get(key)
            )
            raise ValueError(f"agent {k}'s LoRA config differs from agent 0's in {differ}")
    return configs[0]


def multilora_overrides(agents: int) -> dict[str, Any]:
    """The verl overrides (beyond stage 1's, run_atgrpo.py) that run the relay with one LoRA per agent:
    the number of agents (the actor's key, atgrpo_multilora.py), the module that installs the rollout side
    in every verl process (HFModelConfig imports ``external_lib`` in its __post_init__,
    verl/workers/config/model.py:149: in the task runner before its LLM servers are made, in the agent-loop
    workers and in the FSDP workers) and the agent loop that sends each turn on its agent's LoRA."""
    max_loras(agents)  # refuses agents < 1
    return {
        f"+actor_rollout_ref.model.lora.{AGENTS_KEY}": agents,
        "actor_rollout_ref.model.external_lib": VERL_GLUE_MODULE,
        "actor_rollout_ref.rollout.agent.default_agent_loop": AGENT_LOOP,
    }
