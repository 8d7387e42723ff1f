"""Cluster: N Ray actors of one worker class, called as one object.

``cluster.generate(batch)`` blocks and returns the gathered result; ``cluster.async_generate(batch)``
returns a ``PendingCall`` holding the Ray refs (``.refs``) whose ``.get()`` gathers later.
How arguments are split and results gathered is the method's ``@register`` dispatch mode. A Cluster finds
the method by name (mypy sees ``Any``): the pipelines call workers through the typed clients of
``roll_ma.workers.clients``, which use ``dispatch``; the attribute form serves workers calling workers (an
env worker's ``rollout.generate``) and tests.
Waiting never hangs silently: actors that do not start within ``start_timeout_s``, and calls
without a sign of life for ``stall_timeout_s``, raise an error naming the role, the rank, the
worker's last report and its log files (``roll_ma.distributed.watchdog``).
"""

from __future__ import annotations

import copy
import functools
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from roll_ma.distributed import activity
from roll_ma.distributed.ray_health import ray_responds
from roll_ma.distributed.resources import ResourceManager
from roll_ma.distributed.watchdog import WorkerError, WorkerStalled, WorkerStartError, wait_for_call
from roll_ma.distributed.worker import Dispatch, registered_methods
from roll_ma.packing import balanced_shares, concat_padded
from roll_ma.protocol import DataProto

CLOSE_TIMEOUT_S = 5.0  # short: a SIGTERM's grace period is spent here, and the next run sweeps what is left

__all__ = ["Cluster", "PendingCall", "WorkerError", "WorkerStalled", "WorkerStartError"]


@dataclass
class PendingCall:
    """Refs of a call in flight; ``get()`` waits (never silently forever), surfaces actor errors, gathers."""

    role: str
    method: str
    ranks: list[int]
    refs: list[Any]
    gather: Callable[[list[Any]], Any]
    keys: list[str] = field(default_factory=list)  # each rank's activity report key (its actor name)
    stall_timeout_s: float = 0.0  # no sign of life for this long stops the call (0: wait forever)
    starting: bool = False  # the first call of new actors: a timeout means they did not start

    def get(self, timeout: float | None = None) -> Any:
        """The gathered results; ``timeout`` bounds the whole wait (see ``watchdog.wait_for_call``)."""
        keys = self.keys or [""] * len(self.refs)
        return wait_for_call(self.role, self.method, self.ranks, self.refs, keys, self.gather,
                             self.stall_timeout_s, timeout, self.starting)


def _concat_results(results: list[Any]) -> Any:
    if results and all(isinstance(r, DataProto) for r in results):
        return concat_padded(results)  # ranks pad prompts / responses to their own longest rows
    return results


def _concat_in_order(results: list[DataProto], inverse: np.ndarray) -> DataProto:
    """The ranks' results of a DP_BALANCED call, concatenated and put back in the rows' order."""
    return _concat_results(results).select_idxs(inverse)


def _row_tokens(data: DataProto) -> np.ndarray:
    """(N,) real tokens of each row (1 each when the batch has no attention mask)."""
    if "attention_mask" in data.batch.keys():
        return data.batch["attention_mask"].sum(-1).numpy()
    return np.ones(len(data))


class Cluster:
    """N actors of ``worker_cls`` (ranks 0..N-1) for one role.

    Args:
        start_timeout_s: the actors must answer their first call within this many seconds
            (``resources.actor_start_timeout_s``), else ``WorkerStartError``; the actors are killed.
        wait: wait here until the actors have started. ``False``: return once they are asked for, so a
            caller starts several clusters' actors at once (each spends seconds importing torch and its
            backend) and then calls ``wait_started`` on each; the timeout counts from that call.
        stall_timeout_s: a call whose ranks show no sign of life for this long raises
            ``WorkerStalled`` (``trainer.stall_timeout_s``; 0: wait forever).
    """

    def __init__(
        self,
        role: str,
        worker_cls: type,
        num_workers: int,
        resources: ResourceManager | None = None,
        init_kwargs: dict[str, Any] | None = None,
        env_vars: dict[str, str] | None = None,
        start_timeout_s: float = 300.0,
        stall_timeout_s: float = 0.0,
        wait: bool = True,
    ):
        import ray

        if num_workers < 1:
            raise ValueError(f"{role}: a cluster needs at least one worker, got {num_workers}")
        self.role = role
        self.world_size = num_workers
        self.stall_timeout_s = stall_timeout_s
        self._methods = registered_methods(worker_cls)
        self._closable = callable(getattr(worker_cls, "close", None))  # Worker.close: shutdown_clusters
        resources = resources or ResourceManager.cpu_only()
        remote_cls: Any = ray.remote(reporting_init_errors(worker_cls))  # an actor class of worker_cls
        tag = uuid.uuid4().hex[:6]
        self.workers = []
        self._keys = [f"{role}_{rank}_{tag}" for rank in range(num_workers)]  # actor names = report keys
        self._rank_ids = list(range(num_workers))  # the role's rank of each worker here (see ``share``)
        for rank in range(num_workers):
            options = resources.actor_options(role, rank)
            options["name"] = self._keys[rank]
            self.workers.append(
                remote_cls.options(**options).remote(
                    role=role,
                    rank=rank,
                    world_size=num_workers,
                    env_vars=dict(env_vars or {}),
                    **(init_kwargs or {}),
                )
            )
        self._start_timeout_s = start_timeout_s
        started = self._call_ranks("ping", list(range(num_workers)), ((), {}), list)
        started.starting = True  # a timeout here names every rank that did not start
        started.method = "__init__"  # what failed, when a rank's constructor raised (see ping)
        self._starting: PendingCall | None = started
        if wait:
            self.wait_started()

    def wait_started(self) -> None:
        """Wait until every actor has answered its first call, then give the ranks rank 0's rendezvous
        address; on an error or the start timeout the actors are killed. A no-op once started."""
        if self._starting is None:
            return
        try:
            self._starting.get(timeout=self._start_timeout_s)
            # rank 0 is the rendezvous point of torch.distributed inside the role
            addr, port = self._call_ranks("master_address", [0], ((), {}), lambda r: r[0]).get()
            self._call_ranks("set_master", list(range(self.world_size)), ((addr, port), {}), list).get()
        except BaseException:
            self.shutdown(close_timeout_s=0)  # actors still waiting for resources would stay queued in Ray
            raise
        self._starting = None

    # ------------------------------------------------------------------ calling
    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        blocking = not name.startswith("async_")
        method = name if blocking else name[len("async_") :]
        if method not in self._methods:
            raise AttributeError(
                f"{self.role} workers have no registered method {method!r}; "
                f"registered: {sorted(self._methods)}"
            )

        def call(*args: Any, **kwargs: Any) -> Any:
            pending = self.dispatch(method, *args, **kwargs)
            return pending.get() if blocking else pending

        return call

    def dispatch(self, method: str, *args: Any, **kwargs: Any) -> PendingCall:
        mode = self._methods[method]
        ranks = list(range(self.world_size))
        if mode is Dispatch.RANK_ZERO:
            return self._call_ranks(method, [0], (args, kwargs), lambda r: r[0])
        if mode is Dispatch.ONE_TO_ALL:
            return self._call_ranks(method, ranks, (args, kwargs), list)
        # DP_COMPUTE: split the DataProto argument by rank, concat the results in the original order
        data, rest, key = _pop_data(args, kwargs)
        gather = _concat_results
        if mode is Dispatch.DP_BALANCED and self.world_size > 1 and len(data) > 0:
            shares = balanced_shares(_row_tokens(data), self.world_size)
            pieces = [data.select_idxs(s) for s in shares]
            served = np.concatenate([s for s in shares if len(s)])  # the rows in the order results come
            gather = functools.partial(_concat_in_order, inverse=np.argsort(served, kind="stable"))
        else:
            pieces = data.chunk(self.world_size)
        calls = [(r, p) for r, p in zip(ranks, pieces) if len(p) > 0] or [(0, pieces[0])]
        refs = []
        for rank, piece in calls:
            a, k = ((piece, *rest), kwargs) if key is None else (rest, {**kwargs, key: piece})
            refs.append(getattr(self.workers[rank], method).remote(*a, **k))
        return self._pending(method, [r for r, _ in calls], refs, gather)

    def _call_ranks(self, method: str, ranks: list[int], call_args: tuple, gather: Callable) -> PendingCall:
        args, kwargs = call_args
        if len(ranks) > 1:
            args, kwargs = _put_once(args, kwargs)
        refs = [getattr(self.workers[r], method).remote(*args, **kwargs) for r in ranks]
        return self._pending(method, ranks, refs, gather)

    def _pending(self, method: str, ranks: list[int], refs: list[Any], gather: Callable) -> PendingCall:
        keys = [self._keys[r] for r in ranks]
        named = [self._rank_ids[r] for r in ranks]  # errors name the role's rank, also through a share
        return PendingCall(self.role, method, named, refs, gather, keys, self.stall_timeout_s)

    def share(self, caller: int, callers: int) -> Cluster:
        """The ranks that caller ``caller`` of ``callers`` (e.g. env worker i of E) sends its calls to,
        as a Cluster of those ranks; every rank is some caller's, and each has as few callers as can be.

        E env workers all splitting their rows over all N engines would give every engine E small calls
        per round, run one after another (an actor runs one call at a time): E times the decode steps of
        one call with all of its rows. With shares, E = N pairs env worker i with engine i; E > N gives
        engine j the callers j, j + N, ...; E < N gives caller i the engines i, i + E, ...
        """
        if callers <= 1 or self.world_size <= 1:
            return self
        n = self.world_size
        mine = [caller % n] if callers >= n else list(range(caller % callers, n, callers))
        view = copy.copy(self)
        view.workers = [self.workers[r] for r in mine]
        view._keys = [self._keys[r] for r in mine]
        view._rank_ids = [self._rank_ids[r] for r in mine]
        view.world_size = len(mine)
        return view

    def shutdown(self, close_timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Stop the actors (``shutdown_clusters``); 0 s: kill them at once (actors that never started)."""
        shutdown_clusters([self], close_timeout_s)

    def _kill(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w, no_restart=True)
        if self.workers:
            activity.clear(self._keys)
        self.workers = []


def shutdown_clusters(clusters: Sequence[Cluster | None], close_timeout_s: float = CLOSE_TIMEOUT_S) -> None:
    """Stop every actor of ``clusters``: each first frees what it holds outside its process (``Worker.close``:
    shared-memory files, an engine's processes), all at once, for up to ``close_timeout_s``; then Ray kills
    them. An actor still busy with a call gets killed with its files, which the next run deletes
    (``shm_transfer.remove_orphans``).

    A Ray that no longer answers (its GCS stopped with the driver, by a SIGTERM to the whole process group)
    is asked nothing: the actors went with it, and a call would block for a minute."""
    import ray


    live = [c for c in clusters if c is not None and c.workers]
    if live and not ray_responds():
        for c in live:
            c.workers = []
        return
    if close_timeout_s > 0:
        refs = [w.close.remote() for c in live if c._closable for w in c.workers]
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=close_timeout_s)
    for c in live:
        c._kill()


def reporting_init_errors(worker_cls: type) -> type:
    """``worker_cls`` whose constructor keeps an exception instead of raising it, and whose ``ping`` (the
    Cluster's first call) raises it: the actor stays alive, the driver gets the error as from any call (the
    same few lines), and Ray has no dying actor to dump on the console."""

    class Reporting(worker_cls):
        def __init__(self, *args: Any, **kwargs: Any):
            self._roll_ma_init_error: Exception | None = None
            try:
                super().__init__(*args, **kwargs)
            except Exception as err:  # noqa: BLE001 - raised again by ping, with its traceback
                self._roll_ma_init_error = err

        def ping(self) -> dict[str, Any]:
            if self._roll_ma_init_error is not None:
                raise self._roll_ma_init_error
            return super().ping()

    # Ray names an actor's class in its logs and state: keep the worker's own name
    Reporting.__name__, Reporting.__qualname__ = worker_cls.__name__, worker_cls.__qualname__
    Reporting.__module__ = worker_cls.__module__
    return Reporting


def _put_once(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """DataProto arguments put into Ray's object store once, for every rank of a call to read (Ray hands
    each actor the value behind a top-level ref): the driver serialises a batch once, not once per rank,
    and a node fetches it once for all of its ranks."""
    import ray

    put = lambda v: ray.put(v) if isinstance(v, DataProto) else v  # noqa: E731
    return tuple(put(a) for a in args), {k: put(v) for k, v in kwargs.items()}


def _pop_data(args: tuple, kwargs: dict) -> tuple[DataProto, tuple, str | None]:
    if args and isinstance(args[0], DataProto):
        return args[0], args[1:], None
    for key, value in kwargs.items():
        if isinstance(value, DataProto):
            rest = {k: v for k, v in kwargs.items() if k != key}
            kwargs.clear()
            kwargs.update(rest)
            return value, args, key
    raise TypeError("a dp_compute method needs a DataProto as its first argument")
