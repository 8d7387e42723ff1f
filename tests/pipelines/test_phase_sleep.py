"""A phase's update with a colocated engine: it sleeps at ``rollout.sleep_level`` (never at 0) and wakes
after, also when the update fails."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from roll_ma.pipelines.clusters import RunWorkers
from roll_ma.pipelines.phases.context import PhaseContext


class Engine:
    def __init__(self) -> None:
        self.events: list[str] = []

    def sleep(self, level) -> None:
        self.events.append(f"sleep {level}")

    def wake_up(self) -> None:
        self.events.append("wake_up")


def _context(level, colocated: bool) -> tuple[PhaseContext, Engine]:
    engine = Engine()
    cfg = SimpleNamespace(rollout=SimpleNamespace(sleep_level=level))
    workers = SimpleNamespace(rollout=engine, colocated=lambda: colocated)
    workers.engine_sleep = lambda level: RunWorkers.engine_sleep(workers, level)  # the run's own rule
    return PhaseContext(cfg, None, workers, None, None, [], None), engine  # type: ignore[arg-type]


@pytest.mark.parametrize(("level", "colocated", "expected"), [
    (1, True, ["sleep 1", "update", "wake_up"]),
    ("kv_cache", True, ["sleep kv_cache", "update", "wake_up"]),
    (0, True, ["update"]),  # the engine stays awake, as the RL step leaves it
    (1, False, ["update"]),  # its own GPU: nothing to free
])
def test_the_engine_sleeps_at_its_level_while_a_phase_trains(level, colocated, expected):
    ctx, engine = _context(level, colocated)
    with ctx.training():
        engine.events.append("update")
    assert engine.events == expected


def test_the_engine_wakes_when_the_update_fails():
    ctx, engine = _context("kv_cache", True)
    with pytest.raises(RuntimeError, match="out of memory"), ctx.training():
        raise RuntimeError("out of memory")
    assert engine.events == ["sleep kv_cache", "wake_up"]
