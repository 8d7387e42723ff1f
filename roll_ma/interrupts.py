"""A run stopped from outside: Ctrl-C (SIGINT) and a scheduler's SIGTERM end the same way.

Both unwind the driver as an exception (``KeyboardInterrupt``; ``Terminated`` for SIGTERM, a subclass of
it), so the same ``finally`` blocks stop the workers, delete their shared-memory files and stop the Ray the
run started; the CLI then prints one line saying how to resume and exits 130 (SIGINT) or 143 (SIGTERM).
Without this, SIGTERM reached Ray's own handlers (``ray.init`` installs one that calls ``sys.exit`` wherever
the driver is, and its core worker one that prints ``*** SIGTERM received ***``) and the driver died of an
abort while Python tore the process down.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class Terminated(KeyboardInterrupt):
    """The run got SIGTERM: it stops like Ctrl-C (every cleanup runs), and the CLI exits 143."""

    exit_code = 143


def _raise_terminated(signum: int, frame: Any) -> None:
    # why: a second SIGTERM (a scheduler repeating itself) must not cut the cleanup of the first short
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated()


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside: SIGTERM raises ``Terminated`` in the main thread. The caller's handler is back afterwards.

    ``roll_ma.distributed.ray_env.init_ray`` puts this handler back after ``ray.init`` replaced it."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def exit_code(err: KeyboardInterrupt) -> int:
    """128 + the signal: 143 for SIGTERM, 130 for Ctrl-C."""
    return getattr(err, "exit_code", 130)


def stopped_message(err: KeyboardInterrupt, output_dir: str | Path, resume: str) -> str:
    """One line: what stopped the run, and what the same command does next (``trainer.resume``)."""
    from roll_ma.checkpoint import latest_checkpoint

    what = "stopped by SIGTERM" if isinstance(err, Terminated) else "interrupted (Ctrl-C)"
    last = latest_checkpoint(output_dir)
    if last is None:
        return f"{what}; no checkpoint was written yet, so running the same command starts afresh"
    if resume == "auto":
        return f"{what}; run the same command to resume from {last[1]} (trainer.resume=auto)"
    return f"{what}; to resume from {last[1]}, run the same command with trainer.resume=auto"
