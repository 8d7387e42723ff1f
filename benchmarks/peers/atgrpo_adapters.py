"""One LoRA adapter per agent on one PEFT model, for PettingLLMs' ``lora`` regime (issue 60, stage 2, plan
item 1): the adapters' names, adding them, which parameters are whose (one optimizer per agent), switching
the active agent, and splitting a batch's rows by agent and putting the per-agent results back in row order.

No verl here (torch and peft only): atgrpo_multilora.py puts this on verl 0.9.1's FSDP2 engine and worker.

Why one optimizer per agent: an update of agent k must leave agent j's LoRA weights and Adam moments exactly
as they were. One optimizer over every adapter would do that only while j's gradients stay ``None``; a zeroed
(not freed) gradient, or a gradient left over from j's own last update, makes AdamW move j by its momentum
and weight decay. Here agent k's optimizer holds agent k's parameters and nothing else, and every agent's
gradients are freed before an update (``free_gradients``), so no step and no gradient-norm clip can see
another agent's state.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable

import torch

# (B,) int64 column of a batch: the agent whose adapter a row is scored and trained under.
AGENT_COLUMN = "agent_id"
# The adapter verl (and peft's get_peft_model) creates; the agents' adapters are copies of its config.
TEMPLATE_ADAPTER = "default"


def adapter_name(agent_id: int) -> str:
    return f"agent_{agent_id}"


def add_agent_adapters(peft_model, agents: int, template: str = TEMPLATE_ADAPTER) -> None:
    """Give ``peft_model`` adapters agent_0 .. agent_{agents-1}, each with ``template``'s LoRA config and its
    own fresh initialisation (lora_B zero: every agent starts as the base model), then drop ``template``.
    Agent 0 is left active."""
    if agents < 1:
        raise ValueError(f"agents must be >= 1, got {agents}")
    config = peft_model.peft_config[template]
    for agent_id in range(agents):
        peft_model.add_adapter(adapter_name(agent_id), copy.deepcopy(config))
    peft_model.set_adapter(adapter_name(0))
    peft_model.delete_adapter(template)


def agent_parameters(module: torch.nn.Module, agent_id: int) -> list[tuple[str, torch.nn.Parameter]]:
    """Agent ``agent_id``'s LoRA parameters, by name (``...lora_A.agent_3.weight``); the dots on both sides
    keep agent_1 from matching agent_10."""
    tag = f".{adapter_name(agent_id)}."
    params = [(name, p) for name, p in module.named_parameters() if tag in name]
    if not params:
        raise ValueError(f"no parameters of adapter {adapter_name(agent_id)!r} in {type(module).__name__}")
    return params


def build_agent_optimizers(
    module: torch.nn.Module, agents: int, make_optimizer: Callable[[list[torch.nn.Parameter]], object]
) -> list:
    """One optimizer per agent, agent k's over agent k's parameters only (``make_optimizer`` is verl's
    build_optimizer with the actor's settings in atgrpo_multilora.py)."""
    optimizers = [make_optimizer([p for _, p in agent_parameters(module, k)]) for k in range(agents)]
    mine = [{id(p) for group in opt.param_groups for p in group["params"]} for opt in optimizers]
    for k in range(agents):  # no parameter shared by two agents' optimizers (a wrong name filter would)
        for j in range(k + 1, agents):
            if mine[k] & mine[j]:
                raise ValueError(f"agents {k} and {j} share parameters")
    return optimizers


def set_agent_adapter(peft_model, agent_id: int) -> None:
    """Make agent ``agent_id``'s adapter the one every forward runs under. peft also marks it the only
    trainable adapter (``requires_grad`` False on the others); FSDP2 copies a sharded parameter's
    requires_grad onto its gathered one at each all-gather (torch _fsdp_param.py ``to_unsharded``), so this
    is safe on verl's FSDP2 module too."""
    peft_model.set_adapter(adapter_name(agent_id))


def free_gradients(optimizers: Iterable) -> None:
    """Every agent's gradients to ``None``: the next backward fills only the active agent's, and verl's clip
    (over all of the module's parameters) sees only those."""
    for optimizer in optimizers:
        optimizer.zero_grad(set_to_none=True)


def rows_by_agent(agent_ids: torch.Tensor, agents: int) -> dict[int, torch.Tensor]:
    """``agent_ids`` (B,) -> {agent: (B_k,) row indices in batch order}, agents present only."""
    if agent_ids.dim() != 1:
        raise ValueError(f"{AGENT_COLUMN} must be (B,), got shape {tuple(agent_ids.shape)}")
    ids = agent_ids.long().cpu()
    if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= agents):
        raise ValueError(f"{AGENT_COLUMN} outside 0..{agents - 1}: {sorted(set(ids.tolist()))}")
    return {k: torch.nonzero(ids == k).flatten() for k in range(agents) if bool((ids == k).any())}


def in_row_order(parts: list[tuple[torch.Tensor, list[torch.Tensor]]], batch_size: int) -> list[torch.Tensor]:
    """Per-agent results back in batch order: ``parts`` is [(rows (B_k,), [one tensor per row])]."""
    out: list[torch.Tensor | None] = [None] * batch_size
    for rows, values in parts:
        if len(rows) != len(values):
            raise ValueError(f"{len(values)} results for {len(rows)} rows")
        for row, value in zip(rows.tolist(), values):
            out[row] = value
    missing = [i for i, v in enumerate(out) if v is None]
    if missing:
        raise ValueError(f"rows without a result: {missing}")
    return out  # type: ignore[return-value]
