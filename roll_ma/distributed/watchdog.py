"""Waiting on workers without ever waiting silently forever.

``wait_for_call`` gathers the results of one call made to several ranks of a role and stops
with an error instead of hanging when:

- a rank raises or its actor dies: at once, even while other ranks are still running (a rank
  blocked in a collective on a dead peer would otherwise hold the driver forever);
- the call is the start of the actors and they have not answered within the start timeout
  (``resources.actor_start_timeout_s``): Ray could not place them, start their processes, or
  the processes could not register (e.g. token authentication they cannot pass);
- no rank still running has shown a sign of life for ``stall_timeout_s``
  (``trainer.stall_timeout_s``). Signs of life are the reports workers publish
  (``roll_ma.distributed.activity``: methods starting and returning, progress bars, nested
  calls progressing) and ranks answering. A long call that keeps reporting is never stopped.

Errors name the role, the rank, the method, the worker's last report and its log files.
Progress seen here is passed on as this process's own report, so a worker waiting on other
workers (an env worker on the rollout workers) stays alive while they make progress.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from roll_ma.distributed import activity
from roll_ma.distributed.activity import Report
from roll_ma.errors import RollMaError

START_TIMEOUT_KEY = "resources.actor_start_timeout_s"
STALL_TIMEOUT_KEY = "trainer.stall_timeout_s"


class WorkerError(RollMaError, RuntimeError):
    """An exception inside an actor, re-raised in the driver: a few lines naming the role, rank and method,
    what failed and where; the actor's traceback is in ``details`` (the log file's part)."""

    def __init__(self, role: str, rank: int, method: str, detail: str, message: str | None = None,
                 details: str = ""):
        self.role, self.rank, self.method = role, rank, method
        self.details = details
        super().__init__(message or f"{role} worker rank {rank} failed in {method}():\n{detail}")


class WorkerStalled(WorkerError):
    """A call whose ranks showed no sign of life for the stall timeout."""


class WorkerStartError(WorkerError):
    """Actors that did not start (answer their first call) within the start timeout."""


class ProgressClock:
    """Time since the last sign of life of the ranks a call waits on."""

    def __init__(self, now: float):
        self.last = now
        self._seqs: dict[str, int | None] = {}

    def answered(self, now: float) -> None:
        self.last = now

    def observe(self, now: float, reports: dict[str, Report | None]) -> bool:
        """Take the ranks' latest reports; True when any is new since the last look (a sign of life)."""
        seqs = {k: (r.seq if r is not None else None) for k, r in reports.items()}
        moved = any(k in self._seqs and self._seqs[k] != s for k, s in seqs.items())
        self._seqs.update(seqs)
        if moved:
            self.last = now
        return moved

    def idle(self, now: float) -> float:
        return now - self.last


def describe_ranks(ranks: Sequence[int], reports: Sequence[Report | None], now: float) -> str:
    """One line per rank: its last report and where its logs are (the longest silent first)."""
    ages = [now - r.at if r is not None else float("inf") for r in reports]
    lines = []
    for age, rank, report in sorted(zip(ages, ranks, reports), key=lambda x: (-x[0], x[1])):
        if report is None:
            lines.append(
                f"  rank {rank}: it never reported: Ray did not start its process, or the process could "
                "not register with the cluster; see raylet.out and python-core-worker-*.log in "
                f"{activity.logs_dir()} (on the node Ray placed it on)"
            )
        else:
            lines.append(
                f'  rank {rank}: last report {age:.0f} s ago: "{report.what}" (pid {report.pid} on '
                f"{report.node}); logs: {report.logs} on {report.node}"
            )
    return "\n".join(lines)


def stalled_message(role: str, method: str, timeout_s: float, idle_s: float, ranks: Sequence[int],
                    reports: Sequence[Report | None], now: float) -> str:
    return (
        f"{role} worker rank {_first(ranks, reports, now)} made no progress for {idle_s:.1f} s in {method}() "
        f"({STALL_TIMEOUT_KEY}={timeout_s:g}); the run stops instead of waiting forever.\n"
        f"{describe_ranks(ranks, reports, now)}\n"
        f"If this call legitimately runs longer without a sign of life, raise {STALL_TIMEOUT_KEY} "
        "(0 waits forever)."
    )


def start_message(role: str, timeout_s: float, ranks: Sequence[int], reports: Sequence[Report | None],
                  now: float) -> str:
    return (
        f"{role} worker rank {_first(ranks, reports, now)} did not start within {timeout_s:g} s "
        f"({START_TIMEOUT_KEY}).\n{describe_ranks(ranks, reports, now)}\n"
        "Common causes: the cluster lacks the CPUs or GPUs the workers ask for (`ray status`), or worker "
        "processes cannot pass the cluster's token authentication (README, 'Ray clusters'). Raise "
        f"{START_TIMEOUT_KEY} if workers start slowly here."
    )


def _first(ranks: Sequence[int], reports: Sequence[Report | None], now: float) -> int:
    """The rank silent the longest: the likeliest culprit (others may be waiting on it)."""
    ages = [now - r.at if r is not None else float("inf") for r in reports]
    return min(zip(ages, ranks), key=lambda x: (-x[0], x[1]))[1]


def poll_interval(stall_timeout_s: float, deadline_s: float | None) -> float | None:
    """How often to look at the reports: often enough for the smallest limit, at most every 5 s."""
    limits = [t for t in (stall_timeout_s, deadline_s) if t]
    return min(5.0, max(0.05, min(limits) / 10)) if limits else None


def wait_for_call(
    role: str,
    method: str,
    ranks: Sequence[int],
    refs: Sequence[Any],
    keys: Sequence[str],
    gather: Callable[[list[Any]], Any],
    stall_timeout_s: float = 0.0,
    deadline_s: float | None = None,
    starting: bool = False,
    clock: Any = time,
) -> Any:
    """The gathered results of ``refs`` (one per rank, ``keys``: the ranks' report keys); see the module doc.

    ``deadline_s`` bounds the whole wait (the start of actors, with ``starting``); ``stall_timeout_s``
    bounds the time without a sign of life (0: no bound). ``clock``: ``monotonic()`` and ``time()``
    (the ``time`` module; tests pass a fake).
    """
    import ray

    if starting:  # bounded by the deadline alone: a process being started has nothing to report yet
        stall_timeout_s = 0.0
    index = {ref: i for i, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = set(range(len(refs)))
    start = clock.monotonic()
    progress = ProgressClock(start)
    poll = poll_interval(stall_timeout_s, deadline_s)
    while pending:
        waiting = [refs[i] for i in sorted(pending)]
        ready, _ = ray.wait(waiting, num_returns=1, timeout=poll)
        if ready:  # sweep every other answer that is in too
            ready, _ = ray.wait(waiting, num_returns=len(waiting), timeout=0)
        now = clock.monotonic()
        for ref in ready:
            i = index[ref]
            results[i] = _result(role, ranks[i], method, ref)
            pending.discard(i)
        if ready:
            progress.answered(now)
            if pending:
                done = len(refs) - len(pending)
                activity.note(f"waiting on {role} {method}(): {done}/{len(refs)} answered", force=False)
            continue
        late = sorted(pending)
        timed_out = deadline_s is not None and now - start >= deadline_s
        if not timed_out and not stall_timeout_s:
            continue
        reports = activity.read([keys[i] for i in late])
        if progress.observe(now, reports):
            latest = max((r for r in reports.values() if r is not None), key=lambda r: r.at)
            activity.note(f"waiting on {role} {method}(): {latest.what}", force=False)
        wall = clock.time()
        late_ranks, late_reports = [ranks[i] for i in late], [reports[keys[i]] for i in late]
        if timed_out:
            assert deadline_s is not None  # only a deadline times out
            if starting:
                message = start_message(role, deadline_s, late_ranks, late_reports, wall)
                raise WorkerStartError(role, _first(late_ranks, late_reports, wall), method, "", message)
            raise WorkerError(role, late_ranks[0], method, f"no answer within {deadline_s} s\n"
                              + describe_ranks(late_ranks, late_reports, wall))
        if stall_timeout_s and progress.idle(now) >= stall_timeout_s:
            message = stalled_message(role, method, stall_timeout_s, progress.idle(now), late_ranks,
                                      late_reports, wall)
            raise WorkerStalled(role, _first(late_ranks, late_reports, wall), method, "", message)
    return gather(results)


def _result(role: str, rank: int, method: str, ref: Any) -> Any:
    import ray
    from ray.exceptions import RayActorError, RayTaskError

    try:
        return ray.get(ref)
    except RayTaskError as err:
        # str(err): the actor's traceback less Ray's own frames (the raised copy has no traceback_str)
        raise task_failure(role, rank, method, getattr(err, "cause", None), str(err)) from None
    except RayActorError as err:
        raise actor_failure(role, rank, method, str(err), err.actor_init_failed) from None


def failed_header(role: str, rank: int, method: str) -> str:
    """The first words of a worker's failure: which worker, in which method (``__init__``: not started)."""
    if method == "__init__":
        return f"{role} worker rank {rank} failed to start (its __init__ raised)"
    return f"{role} worker rank {rank} failed in {method}()"


def task_failure(role: str, rank: int, method: str, cause: BaseException | None, tb: str) -> WorkerError:
    """The driver's error for an exception an actor's method raised (``cause``, with its traceback text)."""
    from roll_ma.error_report import fix_for, plain, summarize

    tb = plain(tb)
    if isinstance(cause, WorkerError):  # the actor's own call into another worker failed: that one is named
        via = f"---- re-raised by {role} worker rank {rank} in {method}() ----"
        cause.details = f"{cause.details}\n{via}\n{tb}"
        return cause
    header = failed_header(role, rank, method)
    if isinstance(cause, RollMaError):  # its message already says what, where and the fix
        message = f"{header}: {Exception.__str__(cause)}"
        details = "\n".join(filter(None, [cause.details, tb]))
        return WorkerError(role, rank, method, "", message, details=details)
    known = cause is not None and not type(cause).__module__.startswith("ray.")  # not Ray's stand-in
    text = f"{type(cause).__name__}: {cause}" if known else ""
    return WorkerError(role, rank, method, "", summarize(header, text, tb, fix_for(cause)), details=tb)


def actor_failure(role: str, rank: int, method: str, text: str, in_init: bool) -> WorkerError:
    """The driver's error for an actor that died: in ``__init__`` (``in_init``: ``text`` holds its
    traceback), or later (killed, out of memory, its node lost)."""
    from roll_ma.error_report import plain, short, summarize

    text = plain(text)
    if in_init:
        header = failed_header(role, rank, "__init__")
        return WorkerError(role, rank, method, "", summarize(header, "", text), details=text)
    said = [ln.strip() for ln in text.strip().splitlines() if ln.strip() and not ln.startswith("\t")]
    message = (f"{role} worker rank {rank} died in {method}(): {short(' '.join(said) or 'no reason given')}\n"
               f"  where: the actor's process (its logs: {activity.logs_dir()})\n"
               "  fix: a process killed without a Python error is most often out of memory (dmesg, `ray "
               "memory`); the log file below has Ray's full report")
    return WorkerError(role, rank, method, "", message, details=text)
