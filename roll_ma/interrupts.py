"""A run stopped from outside: Ctrl-C (SIGINT), a scheduler's SIGTERM and a closed terminal or ssh session
(SIGHUP) end the same way, at any moment.

Each unwinds the driver as an exception (``KeyboardInterrupt``; ``Terminated`` for SIGTERM and ``HungUp``,
a subclass of it, for SIGHUP), so the same ``finally`` blocks stop the workers, delete their shared-memory
files and stop the Ray the run started; the CLI then prints one line saying how to resume (also written to
the run's log file: after a SIGHUP the terminal is usually gone) and exits 128 + the signal: 130 (SIGINT),
143 (SIGTERM) or 129 (SIGHUP). Left alone, a SIGHUP killed the driver outright, and the Ray agents it had
started outlived it by a minute or more.

- Which signal it was is recorded when it arrives: Ray turns any exception a signal handler raises inside
  its blocking calls (``ray.wait``, ``ray.get``) into a plain ``KeyboardInterrupt``, so the exception's
  type alone would report a SIGTERM as Ctrl-C.
- After the first stop, a second SIGINT, SIGTERM or SIGHUP (a scheduler repeating itself, a second Ctrl-C)
  is ignored: the cleanup it would cut short is what leaves nothing running, and it is bounded.
- ``deferred_stops``: while Ray starts, a stop is only recorded and raised once ``ray.init`` returned;
  an exception inside it left a half-built Ray (a segmentation fault at exit, agents left running). A stop
  inside an import waits for the import to end the same way (a half-imported torch crashes when touched).
- Without this, SIGTERM reached Ray's own handlers (``ray.init`` installs one that calls ``sys.exit``
  wherever the driver is, and its core worker one that prints ``*** SIGTERM received ***``) and the driver
  died of an abort while Python tore the process down.
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

    signum = signal.SIGTERM


class HungUp(Terminated):
    """The run got SIGHUP (its terminal or ssh session closed): it stops as for SIGTERM, and exits 129."""

    signum = signal.SIGHUP


# the handled signals: what the stop line calls each (SIGINT's own: a plain KeyboardInterrupt)
STOPPED_BY: dict[int, str] = {
    signal.SIGINT: "interrupted (Ctrl-C)",
    signal.SIGTERM: "stopped by SIGTERM",
    signal.SIGHUP: "stopped by SIGHUP (a closed terminal or ssh session)",
}


class _Stops:
    """This process's stop signals (signals are per process: state here, not in an object passed around)."""

    depth = 0  # nested ``stop_signals`` (the CLI's around roll_ma.train's): the outermost owns the handlers
    received: int | None = None  # the first SIGINT / SIGTERM / SIGHUP since the outermost one was entered
    deferred = False  # inside ``deferred_stops``: record, do not raise


def _on_stop(signum: int, frame: Any) -> None:
    if _Stops.received is None:
        _Stops.received = signum
    if _Stops.deferred:
        return
    if _importing(frame):  # raised inside an import, it leaves a half-imported module (torch: a crash later)
        _deliver_again(signum)
        return
    _ignore_further_stops()
    raise stop_error(signum)


def _ignore_further_stops() -> None:
    # why: a second signal must not cut the cleanup of the first short
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for signum in (signal.SIGINT, signal.SIGHUP):
        if signal.getsignal(signum) is _on_stop:
            signal.signal(signum, signal.SIG_IGN)


def _importing(frame: Any) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _deliver_again(signum: int) -> None:
    """The signal once more to the main thread in a moment: the import will have moved on, or ended."""
    main = threading.main_thread().ident
    assert main is not None  # the main thread runs this handler
    timer = threading.Timer(0.05, signal.pthread_kill, (main, signum))
    timer.daemon = True
    timer.start()


def stop_error(signum: int) -> KeyboardInterrupt:
    if signum == signal.SIGHUP:
        return HungUp()
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """Inside: SIGTERM raises ``Terminated``, SIGHUP ``HungUp`` and SIGINT ``KeyboardInterrupt`` in the main
    thread, once (see the module's docstring). The caller's handlers are back afterwards.

    SIGINT and SIGHUP are left alone where they are ignored (SIGINT in a shell's background job: it is not
    the job's to get; SIGHUP under ``nohup``: the run is meant to outlive its terminal).
    ``roll_ma.distributed.ray_env.init_ray`` keeps Ray from replacing the SIGTERM handler."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    _Stops.depth += 1
    if _Stops.depth > 1:
        try:
            yield
        finally:
            _Stops.depth -= 1
        return
    _Stops.received = None
    previous_term = signal.signal(signal.SIGTERM, _on_stop)
    previous_int = signal.getsignal(signal.SIGINT)
    if previous_int is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_stop)
    previous_hup = signal.getsignal(signal.SIGHUP)
    if previous_hup is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _on_stop)
    try:
        yield
    finally:
        _Stops.depth -= 1
        signal.signal(signal.SIGTERM, previous_term if previous_term is not None else signal.SIG_DFL)
        if previous_int is signal.default_int_handler:
            signal.signal(signal.SIGINT, previous_int)
        if previous_hup is not signal.SIG_IGN:
            signal.signal(signal.SIGHUP, previous_hup if previous_hup is not None else signal.SIG_DFL)


@contextlib.contextmanager
def deferred_stops() -> Iterator[None]:
    """Inside (``ray.init``): a SIGINT, SIGTERM or SIGHUP is recorded only; leaving, it is raised as it would
    have been. Outside ``stop_signals`` this changes nothing."""
    if _Stops.depth == 0 or _Stops.deferred or threading.current_thread() is not threading.main_thread():
        yield
        return
    _Stops.deferred = True
    try:
        yield
    except Exception:
        if _Stops.received is None:
            raise
        # else the stop's doing (a SIGTERM to the process group stops Ray's processes as they start)
    finally:
        _Stops.deferred = False
    if _Stops.received is not None:
        _on_stop(_Stops.received, None)


def stop_behind(err: BaseException | None) -> KeyboardInterrupt | None:
    """The stop an error grew out of, if any. A stop raised inside a library can come out as that library's
    own error (a ``finally`` touching a name the interrupted code never set), or be caught by a broad
    handler and said as a config problem; such an error is the stop, and ends as one. ``err`` None: a stop
    that arrived and was swallowed on the way."""
    seen: set[int] = set()
    current = err
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    if _Stops.depth == 0 or _Stops.received is None:
        return None
    _ignore_further_stops()  # the stop is taken now: a redelivered one must not cut its cleanup short
    return stop_error(_Stops.received)


def stop_signal(err: KeyboardInterrupt) -> int:
    """The signal that stopped the run (``err`` may be Ray's plain ``KeyboardInterrupt`` standing for a
    SIGTERM or SIGHUP: the signal recorded when it arrived says which)."""
    if isinstance(err, Terminated):
        return err.signum
    if _Stops.received in (signal.SIGTERM, signal.SIGHUP):
        return _Stops.received
    return signal.SIGINT


def exit_code(err: KeyboardInterrupt) -> int:
    """128 + the signal: 130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP."""
    return 128 + stop_signal(err)


def stopped_message(err: KeyboardInterrupt, output_dir: str | Path | None, resume: str,
                    finished: str | None = None) -> str:
    """One line: what stopped the run, and what the same command does next (``trainer.resume``).

    ``output_dir`` None: stopped while the config was being read, before the run began. ``finished``: what
    the same command would say of a run whose checkpoint already holds all of it (stopped as it finished)."""
    what = STOPPED_BY[stop_signal(err)]
    if output_dir is None:
        return f"{what} before the run started; run the same command to start it"
    if finished:
        return f"{what} as the run was finishing, its work saved: {finished}"
    from roll_ma.checkpoint import latest_checkpoint

    last = latest_checkpoint(output_dir)
    if last is None:
        return f"{what}; no checkpoint was written yet, so running the same command starts afresh"
    if resume == "auto":
        return f"{what}; run the same command to resume from {last[1]} (trainer.resume=auto)"
    return f"{what}; to resume from {last[1]}, run the same command with trainer.resume=auto"
