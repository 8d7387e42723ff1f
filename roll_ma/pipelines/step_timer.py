"""Where a run's time goes: the seconds of each named stage of a step (``timing/``) or of the start-up
(``startup/``), and the start-up's console line."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

# The step's named stages, one after another on the driver: with the bookkeeping between them (record)
# they cover the step's wall time; timing/unaccounted is what none of them holds
STAGES = (
    "rollout", "sleep", "reference", "old_log_probs", "values", "advantages", "update", "joint_search",
    "sync", "eval", "record",
)  # fmt: skip

# the trainer's work on the timeline (benchmarks): scoring, the update, what is left of the sync
TIMELINE_LANES = {"reference": "score", "old_log_probs": "score", "update": "update", "sync": "sync"}


class StepTimer:
    """Collects ``<prefix>/<name>`` seconds: one step's (``timing/``) or the run's start-up (``startup/``)."""

    def __init__(self, prefix: str = "timing") -> None:
        self.prefix = prefix
        self.started = time.perf_counter()  # the step's wall clock starts here (timing/step_wall)
        self.times: dict[str, float] = {}
        self.timeline: dict[str, float] = {}  # timeline/<lane>_start|_end: wall clock of the trainer's work

    def total(self) -> dict[str, float]:
        """Sets ``<prefix>/total`` to the seconds since this timer started (the start-up's: to the first
        step); returns every time."""
        self.times[f"{self.prefix}/total"] = time.perf_counter() - self.started
        return self.times

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start, wall = time.perf_counter(), time.time()
        yield
        key = f"{self.prefix}/{name}"
        self.times[key] = self.times.get(key, 0.0) + time.perf_counter() - start
        lane = TIMELINE_LANES.get(name)
        if lane is not None:
            self.timeline.setdefault(f"timeline/{lane}_start", wall)
            self.timeline[f"timeline/{lane}_end"] = time.time()


def startup_line(times: dict[str, float]) -> str:
    """``[roll_ma] start-up 12.3 s: ray 2.0, workers 1.1, ...``: each stage that ran, in the order it ran."""
    stages = [
        f"{key.split('/', 1)[1].replace('_', ' ')} {seconds:.1f}"
        for key, seconds in times.items() if key != "startup/total"
    ]  # fmt: skip
    return f"[roll_ma] start-up {times['startup/total']:.1f} s: " + ", ".join(stages)
