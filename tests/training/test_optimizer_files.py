"""Optimizer states in a checkpoint (optimizer_files): who writes which file, and a missing one named."""

from __future__ import annotations

from typing import Any

import pytest

from roll_ma.training.optimizer_files import load_optimizer_states, save_optimizer_states


class _Engine:
    def __init__(self, zero_stage: int, state: dict[str, Any]):
        self.zero_stage, self.state, self.loaded = zero_stage, state, None

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, shards: list[dict[str, Any]]) -> None:
        self.loaded = shards


def test_rank0_writes_a_replicated_state_and_every_rank_its_shard(tmp_path):
    engines: Any = {"x": _Engine(0, {"m": 1}), "y": _Engine(2, {"m": 2})}
    save_optimizer_states(engines, tmp_path, rank=1)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.pt")) == ["optim/y/rank1.pt"]
    save_optimizer_states(engines, tmp_path, rank=0)
    load_optimizer_states(engines, tmp_path, world_size=2)
    assert engines["x"].loaded == [{"m": 1}] and engines["y"].loaded == [{"m": 2}, {"m": 2}]


def test_a_missing_shard_is_named(tmp_path):
    engines: Any = {"y": _Engine(1, {})}
    save_optimizer_states(engines, tmp_path, rank=0)
    with pytest.raises(FileNotFoundError, match="rank1.pt"):
        load_optimizer_states(engines, tmp_path, world_size=2)
