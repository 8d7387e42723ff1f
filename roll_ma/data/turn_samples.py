"""Turns as training rows: one finished turn of one agent -> one DataProto row.

Env workers keep each turn's token lists unpadded while episodes run, then pad once here:
prompts on the left, responses on the right (the layout documented in roll_ma.protocol).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import torch

from roll_ma.packing import pack_sequences, right_pad
from roll_ma.protocol import DataProto


@dataclass
class TurnSample:
    """One agent's turn: what it saw, what it said, and what it earned."""

    prompt_ids: list[int]
    response_ids: list[int]
    rollout_log_probs: list[float]
    agent_id: int
    adapter_version: int
    episode_id: str
    group_id: str
    turn: int
    player: int
    env_name: str
    response_text: str = ""
    reward: float = 0.0  # this player's reward from this turn until its next turn (penalties included)
    done: bool = False  # the episode ended at or after this turn
    format_error: bool = False
    prompt_truncated: bool = False
    reward_class: str = ""  # the env's label for class-balanced advantages ("" = none)
    # token ids of each legal action's answer (filled only for the action entropy bonus)
    action_choices: list[list[int]] = field(default_factory=list)


_NON_TENSOR = [
    f.name
    for f in fields(TurnSample)
    if f.name not in ("prompt_ids", "response_ids", "rollout_log_probs", "reward")
]


def collate_turns(samples: Sequence[TurnSample], pad_id: int, meta_info: dict | None = None) -> DataProto:
    """All turns of a rollout as one DataProto (see roll_ma.protocol for the keys); meta_info gets pad_id."""
    if not samples:
        return DataProto.empty({**(meta_info or {}), "pad_id": pad_id})
    tensors = pack_sequences([s.prompt_ids for s in samples], [s.response_ids for s in samples], pad_id)
    R = tensors["responses"].shape[1]
    tensors["rollout_log_probs"] = right_pad([s.rollout_log_probs for s in samples], 0.0, torch.float32, R)
    tensors["scores"] = torch.tensor([s.reward for s in samples], dtype=torch.float32)
    non_tensors = {name: [getattr(s, name) for s in samples] for name in _NON_TENSOR}
    return DataProto.from_dict(tensors, non_tensors, {**(meta_info or {}), "pad_id": pad_id})
