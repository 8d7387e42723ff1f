"""A failure as the console shows it (a few lines: what, where, the fix) and as its log file keeps it.

Workers' exceptions reach the driver as ``WorkerError`` (``distributed/watchdog.py``), built from the
actor's traceback text with ``summarize``; the CLI and ``roll_ma.train`` then write the full tracebacks
(the driver's and the workers') to ``<trainer.output_dir>/logs/error_<time>.log`` with ``attach_log``,
and the message ends with that path. Nothing here prints colour codes: ``plain`` strips Ray's.

``run_line`` prints one of the run's own lines (a checkpoint written, a stop) on the console and writes it
to the run's log file too, with the time; a console that is gone (a closed terminal) is no failure.
"""

from __future__ import annotations

import datetime
import inspect
import os
import re
import sys
import sysconfig
import tempfile
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roll_ma.errors import RollMaError

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_FRAME = re.compile(r'^(?P<indent>\s*)File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<fn>.+)$')
_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"])
MAX_WHAT_LINES = 3
MAX_LINE_CHARS = 300
# torch's CUDA out-of-memory error (matched by name: this module imports no torch)
GPU_MEMORY_FIX = ("the GPU ran out of memory: lower train.max_tokens_per_micro_batch (the update) or "
                  "train.score_max_tokens_per_micro_batch (scoring), or set model.gradient_checkpointing="
                  "true; with the rollout engine on the same GPU, rollout.sleep_level=1 frees its weights "
                  "while the trainer works (the default, kv_cache, frees only its KV cache), or lower "
                  "rollout.gpu_memory_utilization (docs/troubleshooting.md, 'Out of memory')")
UNKNOWN_FIX = ("the log file below has the full traceback; an error in the config's own files is yours to "
               "fix there, one inside roll_ma's code is a bug to report with that file")


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"

    @property
    def in_library(self) -> bool:
        """Installed packages and the standard library: rarely where the fix is."""
        path = os.path.realpath(self.file)
        return ("site-packages" in path or "dist-packages" in path or path.startswith(_STDLIB)
                or self.file.startswith("<"))


def plain(text: str) -> str:
    """``text`` without terminal escape codes (Ray colours the actor name of a traceback)."""
    return _ANSI.sub("", text)


def parse_traceback(text: str) -> tuple[list[Frame], str]:
    """(the frames, outermost first; the final exception's text) of a formatted traceback."""
    lines = plain(text).strip("\n").splitlines()
    frames, last, indent = [], -1, 0
    for i, line in enumerate(lines):
        m = _FRAME.match(line)
        if m:
            frames.append(Frame(m["file"], int(m["line"]), m["fn"].strip()))
            last, indent = i, len(m["indent"])
    tail = lines[last + 1:]
    while tail and (not tail[0].strip() or len(tail[0]) - len(tail[0].lstrip()) > indent):
        tail = tail[1:]  # the last frame's source line and its ^^^^ markers
    return frames, "\n".join(tail).strip()


def where_of(frames: list[Frame]) -> str:
    """The innermost frame, and the innermost one outside libraries when the error came from a library."""
    if not frames:
        return "unknown (no traceback)"
    inner = frames[-1]
    own = [f for f in frames if not f.in_library]
    if inner.in_library and own:
        return f"{inner}, called from {own[-1]}"
    return str(inner)


def short(text: str) -> str:
    """At most a few lines of ``text``, each cut to a readable length."""
    lines = [ln if len(ln) <= MAX_LINE_CHARS else ln[:MAX_LINE_CHARS] + "..." for ln in text.splitlines()]
    more = len(lines) - MAX_WHAT_LINES
    return "\n".join(lines[:MAX_WHAT_LINES] + ([f"  ... ({more} more lines in the log)"] if more > 0 else []))


def fix_for(err: BaseException | None) -> str:
    """The fix of an exception roll_ma does not know, where its type tells it (a package a worker lacks)."""
    if isinstance(err, ModuleNotFoundError) and err.name:
        return (f"install {err.name.split('.')[0]} in the Python environment the workers run in (on a Ray "
                "cluster: on every node), or remove the import; the log file below has the full traceback")
    if type(err).__name__ == "OutOfMemoryError" and type(err).__module__.startswith("torch"):
        return GPU_MEMORY_FIX
    return UNKNOWN_FIX


def summarize(header: str, exception_text: str, traceback_text: str, fix: str = UNKNOWN_FIX) -> str:
    """The console form of an exception that is not a ``RollMaError``: what (its type and message), where
    (from the traceback), the fix."""
    frames, final = parse_traceback(traceback_text)
    what = short(exception_text or final or "(no message)")
    return f"{header}: {what}\n  where: {where_of(frames)}\n  fix: {fix}"


def code_location(fn: Any) -> str:
    """``file:line in name`` of a function or method's definition (where a wrong return value comes from)."""
    fn = inspect.unwrap(fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return getattr(fn, "__qualname__", repr(fn))
    return f"{code.co_filename}:{code.co_firstlineno} in {code.co_name}"


def raise_location(err: BaseException, file: str | None = None) -> str:
    """``file:line in function``: the deepest frame of ``err``'s traceback in ``file``, else its deepest."""
    frames = traceback.extract_tb(err.__traceback__)
    target = os.path.realpath(file) if file else None
    own = [f for f in frames if target and os.path.realpath(f.filename) == target]
    frame = own[-1] if own else (frames[-1] if frames else None)
    return f"{frame.filename}:{frame.lineno} in {frame.name}" if frame else "unknown (no traceback)"


def log_dir(output_dir: str | os.PathLike | None) -> Path:
    """Where the run's logs go: ``<output_dir>/logs`` (the system temp dir when that cannot be made)."""
    if output_dir:
        path = Path(output_dir) / "logs"
        try:
            path.mkdir(parents=True, exist_ok=True)
            return path
        except OSError:
            pass
    return Path(tempfile.gettempdir())


def run_log(output_dir: str | os.PathLike | None) -> Path:
    """The run's log file, ``<output_dir>/logs/run.log``: what the workers print (engine, Ray, library logs;
    ``distributed/worker_output.py``), appended to by every run and resume in that directory."""
    return log_dir(output_dir) / "run.log"


def run_line(line: str, output_dir: str | os.PathLike | None, stream: Any = None) -> None:
    """``line`` (``[roll_ma] ...``) on the console (``stream``, stdout by default) and, when ``output_dir`` is
    given and exists, in its ``logs/run.log`` as ``(driver HH:MM:SS) line``: among the workers' lines, with
    its time (a run stopped before it made its folder gets none made for this line)."""
    try:
        print(line, file=stream or sys.stdout, flush=True)
    except OSError:  # a closed terminal (EIO): what is written there from now on can never be read
        _console_gone()
    if output_dir is None or not os.path.isdir(output_dir):
        return
    try:
        with open(run_log(output_dir), "a") as log:  # appended whole: the workers' lines go in between
            log.write(f"(driver {datetime.datetime.now():%H:%M:%S}) {line}\n")
    except OSError:  # the console has it; a log that cannot be written is the run's next error to report
        pass


def _console_gone() -> None:
    """Point stdout and stderr at /dev/null: the text still buffered for a closed terminal would otherwise
    fail again as Python exits (which then exits 120, not the run's code)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def log_text(err: BaseException) -> str:
    """The log file's text for ``err``: its message, the driver's traceback and the workers' (``details``)."""
    message = Exception.__str__(err) if isinstance(err, RollMaError) else f"{type(err).__name__}: {err}"
    driver = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    parts = [
        f"roll_ma error, {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"command: {' '.join(sys.argv)}",
        f"cwd: {os.getcwd()}",
        "",
        message,
        "",
        "---- traceback in the driver ----",
        driver,
    ]
    details = getattr(err, "details", "")
    if details:
        parts += ["---- traceback in the worker(s) ----", details]
    return plain("\n".join(parts)) + "\n"


def write_log(err: BaseException, output_dir: str | os.PathLike | None) -> tuple[Path | None, str]:
    """Write ``err``'s log file to ``<output_dir>/logs``, else (that folder cannot be written: a read-only
    or full disk, a file in the way) to the system temp dir. Returns its path (None: nowhere could be
    written) and, when it is not in ``<output_dir>/logs``, why."""
    name = f"error_{datetime.datetime.now():%Y%m%d_%H%M%S}_{os.getpid()}.log"
    folders = ([Path(output_dir) / "logs"] if output_dir else []) + [Path(tempfile.gettempdir())]
    note = ""
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(log_text(err))
            return folder / name, note
        except OSError as failed:
            note = note or f"trainer.output_dir's {folder} cannot be written: {_reason(failed)}"
    return None, note


def _reason(err: OSError) -> str:
    if isinstance(err, (FileExistsError, NotADirectoryError)):
        return f"a file is in the way ({err.filename})"
    return (err.strerror or str(err)).lower()


def attach_log(err: RollMaError, output_dir: str | os.PathLike | None) -> RollMaError:
    """Write ``err``'s log file (once) and name it in the message."""
    if err.log_path is None:
        path, err.log_note = write_log(err, output_dir)
        err.log_path = str(path) if path else None
    return err


class UnexpectedError(RollMaError):
    """An exception roll_ma does not know, in the driver: its short form (the CLI prints it)."""


def unexpected(err: BaseException, output_dir: str | os.PathLike | None) -> UnexpectedError:
    """The short form of an unknown exception raised in the driver, with its log file written. A file the
    run could not write in ``output_dir`` is named as ``trainer.output_dir``'s problem."""
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    header, fix = "the run failed", fix_for(err)
    if isinstance(err, OSError) and _inside(getattr(err, "filename", None), output_dir):
        header = f"the run could not write to trainer.output_dir={output_dir}"
        fix = ("make trainer.output_dir writable again (its permissions, free disk space) or give another "
               "one; the same command then resumes from the last checkpoint")
    out = UnexpectedError(summarize(header, f"{type(err).__name__}: {err}", text, fix))
    path, out.log_note = write_log(err, output_dir)
    out.log_path = str(path) if path else None
    return out


def _inside(filename: Any, folder: str | os.PathLike | None) -> bool:
    if not filename or not folder or not isinstance(filename, (str, os.PathLike)):
        return False
    file, root = Path(os.path.abspath(filename)), Path(os.path.abspath(folder))
    return file == root or root in file.parents


def error_prefix(stream: Any = None) -> str:
    """'error:', in red only on a terminal (and never with NO_COLOR set)."""
    stream = stream or sys.stderr
    tty = getattr(stream, "isatty", lambda: False)()
    return "\x1b[31merror:\x1b[0m" if tty and not os.environ.get("NO_COLOR") else "error:"
