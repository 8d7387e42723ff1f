"""Progress bars drawn on the driver for work that runs inside Ray actors.

Actors report through ``ray.experimental.tqdm_ray``, which the driver renders as ordinary tqdm bars
(one per actor and task). Bars are on only where the run asks for them: the pipeline sets
``ROLL_MA_PROGRESS_BARS=1`` in every worker's environment when ``trainer.progress_bars`` is true,
so tests and benchmarks that drive workers directly print nothing. Drawn or not, every bar
reports its count as the worker's activity (``roll_ma.distributed.activity``): a moving bar is
a sign of life to the watchdog.
"""

from __future__ import annotations

import os
from typing import Any

from roll_ma.distributed import activity

ENV_FLAG = "ROLL_MA_PROGRESS_BARS"


class NoBar:
    """Stands in for a bar when bars are off."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


class ReportingBar:
    """A bar (drawn or not) whose count is also this worker's activity report."""

    def __init__(self, bar: Any, desc: str, total: int, unit: str):
        self.bar, self.desc, self.total, self.unit, self.n = bar, desc, total, unit, 0
        activity.note(f"{desc}: 0/{total} {unit}")

    def update(self, n: int = 1) -> None:
        self.bar.update(n)
        self.n += n
        activity.note(f"{self.desc}: {self.n}/{self.total} {self.unit}", force=False)

    def close(self) -> None:
        self.bar.close()
        activity.note(f"{self.desc}: done, {self.n}/{self.total} {self.unit}")


def progress_bar(desc: str, total: int, unit: str, draw: bool = True) -> Any:
    """A tqdm-like bar (``update``, ``close``), drawn when bars are on and ``draw``; it always reports."""
    if os.environ.get(ENV_FLAG) != "1" or not draw:
        return ReportingBar(NoBar(), desc, total, unit)
    from ray.experimental.tqdm_ray import tqdm

    return ReportingBar(tqdm(desc=desc, total=total, unit=unit), desc, total, unit)
