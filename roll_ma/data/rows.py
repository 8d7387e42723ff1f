"""Token sequences -> the rows the supervised objectives train on (``training/objective_{sft,dpo}.py``).

SFT rows are the standard layout of ``roll_ma.protocol`` (prompts left-padded, responses right-padded)
with ``agent_id``. A DPO row is one pair: ``chosen_<key>`` and ``rejected_<key>`` for the standard keys
``prompts, responses, input_ids, attention_mask, position_ids, response_mask``, both padded to the same
widths (chosen and rejected run through the model in one forward).
"""

from __future__ import annotations

from collections.abc import Sequence

from roll_ma.packing import pack_sequences
from roll_ma.protocol import DataProto

Tokens = Sequence[int]


def _check(prompts: Sequence[Tokens], agent_ids: Sequence[int], *responses: Sequence[Tokens]) -> None:
    for r in responses:
        if len(r) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(r)} responses")
    if len(agent_ids) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(agent_ids)} agent ids")
    if any(len(x) == 0 for rs in responses for x in rs):
        raise ValueError("every response needs at least one token (its end-of-turn token counts)")


def sft_rows(
    prompts: Sequence[Tokens],
    responses: Sequence[Tokens],
    agent_ids: Sequence[int],
    pad_id: int,
    meta_info: dict | None = None,
) -> DataProto:
    """(prompt, response) token lists of agents -> standard rows (the loss is on the response only)."""
    _check(prompts, agent_ids, responses)
    if not prompts:
        return DataProto.empty({**(meta_info or {}), "pad_id": pad_id})
    tensors = pack_sequences(prompts, responses, pad_id)
    return DataProto.from_dict(
        tensors, {"agent_id": [int(a) for a in agent_ids]}, {**(meta_info or {}), "pad_id": pad_id}
    )


def pair_rows(
    prompts: Sequence[Tokens],
    chosen: Sequence[Tokens],
    rejected: Sequence[Tokens],
    agent_ids: Sequence[int],
    pad_id: int,
    meta_info: dict | None = None,
) -> DataProto:
    """(prompt, chosen, rejected) token lists of agents -> one DPO row per pair (module docstring)."""
    _check(prompts, agent_ids, chosen, rejected)
    if not prompts:
        return DataProto.empty({**(meta_info or {}), "pad_id": pad_id})
    n = len(prompts)
    both = pack_sequences(list(prompts) * 2, list(chosen) + list(rejected), pad_id)  # common widths
    tensors = {
        f"{side}_{k}": v[part]
        for k, v in both.items()
        for side, part in (("chosen", slice(0, n)), ("rejected", slice(n, 2 * n)))
    }
    return DataProto.from_dict(
        tensors, {"agent_id": [int(a) for a in agent_ids]}, {**(meta_info or {}), "pad_id": pad_id}
    )
