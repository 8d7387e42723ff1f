"""What each worker did last, readable by the driver while the worker is busy.

A Ray actor runs one call at a time, so a stuck actor cannot be asked what it is doing. So
every worker writes a one-line report to Ray's key-value store (kept by the cluster's GCS)
whenever something happens: a registered method starts, returns or raises, a progress bar
moves, a call it waits on makes progress, or code calls ``note("...")``. The watchdog
(``roll_ma.distributed.watchdog``) reads these reports to tell a slow call from a stuck one and
to say in its error what the worker did last and where its log files are.

Outside a Ray actor (unit tests, the driver) nothing is written: ``note`` does nothing.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

NAMESPACE = "roll_ma_activity"
_MIN_INTERVAL_S = 1.0  # progress-bar reports are sent at most this often; events always


@dataclass(frozen=True)
class Report:
    """One worker's latest report."""

    what: str  # e.g. "train_step() started", "update alice, step 3: 2/4 batch"
    at: float  # time.time() when it was reported
    seq: int  # counts reports: a new seq is a sign of life
    pid: int
    node: str  # node IP
    logs: str  # this worker's log files, e.g. /tmp/ray/session_.../logs/worker-*-1234.{out,err}


class Reporter:
    """Publishes one worker's reports under ``key`` (its actor name)."""

    def __init__(self, key: str):
        self.key = key
        self.seq = 0
        self._sent_at = 0.0
        self.node, self.logs = _node_and_logs(os.getpid())

    def note(self, what: str, force: bool = True) -> None:
        self.seq += 1
        now = time.time()
        if not force and now - self._sent_at < _MIN_INTERVAL_S:
            return
        report = Report(what[:300], now, self.seq, os.getpid(), self.node, self.logs)
        try:
            from ray.experimental.internal_kv import _internal_kv_put

            _internal_kv_put(self.key, json.dumps(asdict(report)), overwrite=True, namespace=NAMESPACE)
            self._sent_at = now
        except Exception:  # a report must never break the work it describes
            pass


# why: one reporter per worker process, installed by Worker.__init__, so that progress bars and nested
# calls deep inside a strategy can report without a reference being passed down to them.
_reporter: Reporter | None = None


def install(key: str) -> Reporter:
    global _reporter
    _reporter = Reporter(key)
    return _reporter


def note(what: str, force: bool = True) -> None:
    """Report what this worker is doing now (``force=False``: skip if a report went out < 1 s ago)."""
    if _reporter is not None:
        _reporter.note(what, force)


def read(keys: list[str]) -> dict[str, Report | None]:
    """The latest report under each key (None: nothing reported yet, or the store cannot be read)."""
    from ray.experimental.internal_kv import _internal_kv_get

    out: dict[str, Report | None] = {}
    for key in keys:
        try:
            raw = _internal_kv_get(key, namespace=NAMESPACE)
            out[key] = Report(**json.loads(raw)) if raw else None
        except Exception:
            out[key] = None
    return out


def clear(keys: list[str]) -> None:
    try:
        from ray.experimental import internal_kv

        gcs: Any = internal_kv.global_gcs_client  # None before ray.init: the AttributeError is caught
        for key in keys:  # bounded: a GCS that stopped must not hold the driver's teardown
            gcs.internal_kv_del(key.encode(), False, NAMESPACE.encode(), timeout=2)
    except Exception:
        pass


def logs_dir() -> str:
    """This node's Ray log directory (where raylet.out and every worker's .out/.err are)."""
    usual = "/tmp/ray/session_latest/logs"
    try:
        import ray._private.worker as ray_worker

        node = ray_worker.global_worker.node
        return node.get_logs_dir_path() if node is not None else usual  # None: not connected
    except Exception:  # a Ray that moved it: name the usual place
        return usual


def _node_and_logs(pid: int) -> tuple[str, str]:
    try:
        import ray

        node = ray.util.get_node_ip_address()
    except Exception:
        node = "this node"
    return node, f"{logs_dir()}/worker-*-{pid}.{{out,err}}"
