"""Progress bars on a terminal: the workers' bar states drawn as a block of tqdm-style bars at the bottom of
the screen, redrawn in place, each bar gone once it finishes (the step's line then says what the step did).

The block is drawn by ``TerminalBars`` alone, so that it always knows how many lines it holds: to redraw, it
moves the cursor up over the block, clears to the end of the screen and writes the bars again. Whatever else
is printed while bars are up (the step lines, warnings, roll_ma's lines from the workers) goes through
``TerminalBars.write``, which takes the block away, writes the text and draws the block below it again;
``AboveBars`` is the stand-in for ``sys.stdout`` / ``sys.stderr`` that sends the driver's own prints there.
Ray's renderer (``ray.experimental.tqdm_ray``) is not used: its bars stay behind when they finish, carry a
coloured ``(pid=...)`` prefix and do not know about the driver's prints.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, TextIO

UP_AND_CLEAR = "\x1b[{n}A\r\x1b[J"  # cursor up n lines, to column 0, clear to the end of the screen
BAR_FORMAT = "{l_bar}{bar}| {n_fmt}/{total_fmt} UNIT [{elapsed}]"


def _plural(unit: str) -> str:
    return unit if unit.endswith("s") else unit + ("es" if unit.endswith(("ch", "sh", "x")) else "s")


class TerminalBars:
    """The bars of the workers' progress states (``ray.experimental.tqdm_ray`` state dicts: uuid, desc, x,
    total, unit, closed) on the terminal ``stream``; ``clock``: ``monotonic()``, for each bar's elapsed
    time."""

    def __init__(self, stream: TextIO, clock: Any = time):
        self.stream, self.clock = stream, clock
        self._bars: dict[str, dict[str, Any]] = {}  # uuid -> its last state and when it was first seen
        self._drawn = 0  # lines of the block on the screen now
        self._midline = False  # the cursor is inside a line someone is writing: no block until it ends
        self._lock = threading.RLock()

    def update(self, state: dict[str, Any]) -> None:
        """A bar's new state: drawn, redrawn, or (closed) taken off the screen."""
        with self._lock:
            uuid = state["uuid"]
            if state.get("closed"):
                # a bar opened and closed within one of Ray's batches was never drawn: nothing to take away
                if self._bars.pop(uuid, None) is not None:
                    self._draw()
                return
            since = self._bars[uuid]["since"] if uuid in self._bars else self.clock.monotonic()
            self._bars[uuid] = {**state, "since": since}
            self._draw()

    def write(self, stream: TextIO, text: str) -> None:
        """``text`` on ``stream`` (the same terminal), above the bars."""
        if not text:
            return
        with self._lock:
            self._erase()
            stream.write(text)
            stream.flush()
            self._midline = not text.endswith("\n")
            self._draw()

    def close(self) -> None:
        """Take the block off the screen and forget every bar (a worker that died never closes its own)."""
        with self._lock:
            self._bars.clear()
            self._erase()
            self.stream.flush()

    def _erase(self) -> None:
        if self._drawn:
            self.stream.write(UP_AND_CLEAR.format(n=self._drawn))
            self._drawn = 0

    def _draw(self) -> None:
        width, height = _size(self.stream)
        lines = [self._line(bar, width) for bar in self._bars.values()]
        room = max(height - 2, 1)  # the block never scrolls the lines above it off the screen
        if len(lines) > room:
            lines = lines[: room - 1] + [f"... and {len(lines) - room + 1} more bars"]
        text = UP_AND_CLEAR.format(n=self._drawn) if self._drawn else ""
        self._drawn = 0
        if lines and not self._midline:
            text += "".join(line + "\n" for line in lines)
            self._drawn = len(lines)
        self.stream.write(text)
        self.stream.flush()

    def _line(self, bar: dict[str, Any], width: int) -> str:
        from tqdm import tqdm  # type: ignore[import-untyped]
        from tqdm.utils import disp_trim  # type: ignore[import-untyped]

        # no rate: Ray forwards the states in batches, so a rate measured here would be wrong
        elapsed = self.clock.monotonic() - bar["since"]
        unit = _plural(bar.get("unit") or "it")
        line = tqdm.format_meter(bar.get("x", 0), bar.get("total"), elapsed, ncols=width - 1,
                                 prefix=bar.get("desc", ""), bar_format=BAR_FORMAT.replace("UNIT", unit))
        return disp_trim(line, width - 1)  # a line as wide as the screen would wrap and break the count


def _size(stream: TextIO) -> tuple[int, int]:
    """The terminal's columns and rows (80 x 24 where it cannot be asked)."""
    try:
        size = os.get_terminal_size(stream.fileno())
        return max(size.columns, 20), max(size.lines, 3)
    except (OSError, ValueError, AttributeError):
        return 80, 24


class AboveBars:
    """A stand-in for ``sys.stdout`` or ``sys.stderr`` whose text goes above the progress bars."""

    def __init__(self, stream: TextIO, bars: TerminalBars):
        self.stream, self.bars = stream, bars

    def write(self, text: str) -> int:
        self.bars.write(self.stream, text)
        return len(text)

    def isatty(self) -> bool:
        return self.stream.isatty()

    def __getattr__(self, name: str) -> Any:  # flush, fileno, encoding, ...
        return getattr(self.stream, name)


def bars_on_terminal() -> TerminalBars:
    """Bars on this process's terminal, with ``sys.stdout`` and ``sys.stderr`` writing above them until
    ``bars_off``."""
    bars = TerminalBars(sys.stderr)
    sys.stdout, sys.stderr = AboveBars(sys.stdout, bars), AboveBars(sys.stderr, bars)
    return bars


def bars_off(bars: TerminalBars) -> None:
    """Take the bars away and give ``sys.stdout`` / ``sys.stderr`` back (where they are still ours)."""
    bars.close()
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, AboveBars) and stream.bars is bars:
            setattr(sys, name, stream.stream)
