"""Where the workers' output goes: the console keeps progress and roll_ma's own lines, the run's log
file gets everything else (vLLM's engine logs, DeepSpeed's, Ray's, library warnings, prints).

Ray sends every line an actor writes to stdout or stderr to the driver (``log_to_driver``), which by
default prints it prefixed with the actor's name. ``route_worker_output`` puts ``WorkerOutput`` in the
place of that printer, for the Ray session of the run:

- progress bars (``ray.experimental.tqdm_ray`` state lines): on a terminal drawn as bars that redraw in
  place at the bottom of the screen (``terminal_bars.py``; the driver's own prints go above them); off a
  terminal (a file, a pipe) as plain lines, one when a bar finishes (and one every ``PLAIN_EVERY_S``
  seconds while a long one runs), never a ``\\r`` redraw or an escape code;
- lines that begin with ``[roll_ma]`` (roll_ma's messages, and warnings of roll_ma's loggers inside
  the workers: ``worker_logging``): on the console;
- Ray's autoscaler events (a request the cluster cannot place): printed by Ray, as before;
- everything else: ``<trainer.output_dir>/logs/run.log``, each line with the actor's name and pid.

The routing lasts as long as the Ray session (``ray_env.shutdown_ray`` ends it), so that what workers
print while they are being stopped, after the run's last line, also goes to the log file.
"""

from __future__ import annotations

import atexit
import datetime
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

from roll_ma.distributed.terminal_bars import bars_off, bars_on_terminal

OURS = "[roll_ma]"
HANDLER_NAME = "roll_ma_worker_output"
PLAIN_EVERY_S = 30.0  # off a terminal: a running bar's line at most this often
RUN_LOG = "run.log"


def is_terminal(*streams: Any) -> bool:
    """Whether every stream is a terminal (bars redraw there; everywhere else they must not)."""
    return all(getattr(s, "isatty", lambda: False)() for s in streams)


def _counted(done: float, total: float | None, unit: str) -> str:
    """``4/4 episodes``, ``1/1 batch``, ``7 its``."""
    count = f"{done:g}/{total:g}" if total else f"{done:g}"
    plural = (total or done) != 1 and not unit.endswith("s")
    return f"{count} {unit}{('es' if unit.endswith(('ch', 'sh', 'x')) else 's') if plural else ''}"


class PlainProgress:
    """Progress bar states as plain lines: ``desc: 4/4 episodes`` when a bar closes, and ``desc: 2/4
    episodes after 31 s`` at most every ``every_s`` seconds while it runs (``clock``: ``monotonic()``)."""

    def __init__(self, stream: TextIO | None = None, every_s: float = PLAIN_EVERY_S, clock: Any = time):
        self.stream, self.every_s, self.clock = stream, every_s, clock
        self._bars: dict[str, list[float]] = {}  # uuid -> [first seen, last line printed]

    def update(self, state: dict[str, Any]) -> None:
        now = self.clock.monotonic()
        first, last = self._bars.setdefault(state["uuid"], [now, now])
        counted = _counted(state.get("x", 0), state.get("total"), state.get("unit") or "it")
        if state.get("closed"):
            # no duration: Ray forwards the lines in batches, so a short bar's start and end come together
            self._bars.pop(state["uuid"], None)
            self._print(f"{state['desc']}: {counted}")
        elif now - last >= self.every_s:
            self._bars[state["uuid"]][1] = now
            self._print(f"{state['desc']}: {counted} after {now - first:.0f} s")

    def _print(self, line: str) -> None:
        print(line, file=self.stream or sys.stderr, flush=True)


class WorkerOutput:
    """Ray's handler of the workers' forwarded lines (see the module doc).

    Args:
        log_path: the run's log file (appended to; a resumed run adds to the same file).
        terminal: whether the console is a terminal (bars redrawn in place) or not (plain progress lines).
        ray_print: Ray's own printer, ``print_to_stdstream(data, ignore_prefix)``: the autoscaler's events.
    """

    def __init__(self, log_path: str | os.PathLike, terminal: bool, ray_print: Any):
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "a", buffering=1)  # line-buffered: `tail -f` sees lines as they come
        self._lock = threading.Lock()
        self.terminal, self._ray_print = terminal, ray_print
        self.progress = PlainProgress()
        self.bars = bars_on_terminal() if terminal else None
        self.note(f"run started {datetime.datetime.now().isoformat(timespec='seconds')}, pid {os.getpid()}: "
                  f"{' '.join(sys.argv)}")

    def note(self, text: str) -> None:
        """A line of the driver's own in the log file."""
        with self._lock:
            if not self._log.closed:
                self._log.write(f"---- {text} ----\n")

    def __call__(self, data: dict[str, Any]) -> None:
        from ray.experimental.tqdm_ray import RAY_TQDM_MAGIC

        if data.get("pid") == "autoscaler":  # "cannot be scheduled" events: what the user must act on
            self._ray_print(data, ignore_prefix=False)
            return
        shown, logged = [], []
        for line in data.get("lines", []):
            if RAY_TQDM_MAGIC in line or line.startswith(OURS):
                shown.append(line)
            else:
                logged.append(line)
        if logged:
            self._write_log(data, logged)
        if not shown:
            return
        self._show(data, shown, RAY_TQDM_MAGIC)

    def _show(self, data: dict[str, Any], lines: list[str], magic: str) -> None:
        stream = sys.stderr if data.get("is_err") else sys.stdout
        for line in lines:
            if magic not in line:
                print(line, file=stream, flush=True)
                continue
            try:
                state = json.loads(line)
            except ValueError:  # a state line cut by a crash: nothing to show
                continue
            if self.bars is not None:
                self.bars.update(state)
            else:
                self.progress.update(state)

    def _write_log(self, data: dict[str, Any], lines: list[str]) -> None:
        from roll_ma.error_report import plain

        who = data.get("actor_name") or data.get("task_name") or ""
        pid = data.get("pid", "")
        prefix = f"({who} pid={pid})" if who else f"({pid})"
        # a bar drawn inside a library (a model loader's) is a line of \r redraws: its last state is the news
        text = "".join(f"{prefix} {plain(line).split(chr(13))[-1]}\n" for line in lines)
        with self._lock:
            if not self._log.closed:
                self._log.write(text)

    def close(self) -> None:
        if self.bars is not None:
            bars_off(self.bars)
            self.bars = None
        with self._lock:
            self._log.close()


def forget_colour_reset() -> None:
    """Ray's CLI logger (imported by ``ray.init``) calls ``colorama.init``, whose exit hook writes ``ESC[0m``
    to a terminal after the run's last line; roll_ma prints no colours, so there is nothing to reset."""
    for name, module in list(sys.modules.items()):
        if name.endswith("colorama.initialise") and hasattr(module, "reset_all"):
            atexit.unregister(module.reset_all)


def route_worker_output(log_path: str | os.PathLike, terminal: bool | None = None) -> WorkerOutput | None:
    """Send the connected Ray session's worker output through a ``WorkerOutput`` writing ``log_path``
    (replacing Ray's printer, or the handler of an earlier run in this process). None, and Ray's
    printing left as it is, when this Ray has no such hook (another version) or forwards nothing."""
    forget_colour_reset()
    try:
        from ray._private import worker as ray_worker
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        return None
    ray_print = getattr(ray_worker, "print_to_stdstream", None)
    handlers = getattr(dispatcher, "handlers", None)
    if ray_print is None or handlers is None:
        return None
    names = [name for name, _ in handlers]
    if "ray_print_logs" not in names and HANDLER_NAME not in names:
        return None  # ray.init(log_to_driver=False): nothing is forwarded
    for name, handler in handlers:
        if name == HANDLER_NAME and isinstance(handler, WorkerOutput):
            handler.close()  # first: an earlier run's bars give sys.stdout back before this run's take it
    if terminal is None:
        terminal = is_terminal(sys.stdout, sys.stderr)
    output = WorkerOutput(log_path, terminal, ray_print)
    dispatcher.remove_handler("ray_print_logs")
    dispatcher.remove_handler(HANDLER_NAME)
    dispatcher.add_handler(HANDLER_NAME, output)
    return output


def unroute_worker_output() -> None:
    """Take ``WorkerOutput`` out of Ray's hooks and close its log file (before ``ray.shutdown``: the next
    ``ray.init`` of this process prints the workers' output as Ray does)."""
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        return
    for name, handler in list(getattr(dispatcher, "handlers", [])):
        if name == HANDLER_NAME:
            dispatcher.remove_handler(name)
            if isinstance(handler, WorkerOutput):
                handler.close()


class _WorkerFormatter(logging.Formatter):
    """``[roll_ma] warning: ...`` for warnings and errors (the console shows them), ``roll_ma info: ...``
    below (the run's log file)."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        level = record.levelname.lower()
        return f"{OURS} {level}: {text}" if record.levelno >= logging.WARNING else f"roll_ma {level}: {text}"


def worker_logging() -> None:
    """Inside an actor: roll_ma's loggers write to stderr, warnings in the form the driver shows on the
    console and info lines for the run's log file (once per process)."""
    logger = logging.getLogger("roll_ma")
    if any(getattr(h, "_roll_ma", False) for h in logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_WorkerFormatter())
    handler._roll_ma = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
