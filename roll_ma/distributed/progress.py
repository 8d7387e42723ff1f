"""Progress bars drawn on the driver for work that runs inside Ray actors.

Actors report through ``ray.experimental.tqdm_ray``, which the driver renders as ordinary tqdm bars
(one per actor and task). Bars are on only where the run asks for them: the pipeline sets
``ROLL_MA_PROGRESS_BARS=1`` in every worker's environment when ``trainer.progress_bars`` is true,
so tests and benchmarks that drive workers directly print nothing.
"""

from __future__ import annotations

import os
from typing import Any

ENV_FLAG = "ROLL_MA_PROGRESS_BARS"


class NoBar:
    """Stands in for a bar when bars are off."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(desc: str, total: int, unit: str) -> Any:
    """A tqdm-like bar (``update``, ``close``), or a no-op one when bars are off."""
    if os.environ.get(ENV_FLAG) != "1":
        return NoBar()
    from ray.experimental.tqdm_ray import tqdm

    return tqdm(desc=desc, total=total, unit=unit)
