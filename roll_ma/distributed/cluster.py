"""Cluster: N Ray actors of one worker class, called as one object.

``cluster.generate(batch)`` blocks and returns the gathered result; ``cluster.async_generate(batch)``
returns a ``PendingCall`` holding the Ray refs (``.refs``) whose ``.get()`` gathers later.
How arguments are split and results gathered is the method's ``@register`` dispatch mode.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from roll_ma.distributed.resources import ResourceManager
from roll_ma.distributed.worker import Dispatch, registered_methods
from roll_ma.packing import concat_padded
from roll_ma.protocol import DataProto


class WorkerError(RuntimeError):
    """An exception inside an actor, re-raised in the driver with the role, rank and actor traceback."""

    def __init__(self, role: str, rank: int, method: str, detail: str):
        self.role, self.rank, self.method = role, rank, method
        super().__init__(f"{role} worker rank {rank} failed in {method}():\n{detail}")


@dataclass
class PendingCall:
    """Refs of a call in flight; ``get()`` waits, surfaces actor errors, and gathers."""

    role: str
    method: str
    ranks: list[int]
    refs: list[Any]
    gather: Callable[[list[Any]], Any]

    def get(self, timeout: float | None = None) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        results = []
        for rank, ref in zip(self.ranks, self.refs):
            try:
                results.append(ray.get(ref, timeout=timeout))
            except RayTaskError as err:
                raise WorkerError(self.role, rank, self.method, str(err)) from None
            except RayActorError as err:
                raise WorkerError(self.role, rank, self.method, f"the actor died: {err}") from None
            except GetTimeoutError:
                raise WorkerError(self.role, rank, self.method, f"no answer within {timeout} s") from None
        return self.gather(results)


def _concat_results(results: list[Any]) -> Any:
    if results and all(isinstance(r, DataProto) for r in results):
        return concat_padded(results)  # ranks pad prompts / responses to their own longest rows
    return results


class Cluster:
    """N actors of ``worker_cls`` (ranks 0..N-1) for one role."""

    def __init__(
        self,
        role: str,
        worker_cls: type,
        num_workers: int,
        resources: ResourceManager | None = None,
        init_kwargs: dict[str, Any] | None = None,
        env_vars: dict[str, str] | None = None,
    ):
        import ray

        if num_workers < 1:
            raise ValueError(f"{role}: a cluster needs at least one worker, got {num_workers}")
        self.role = role
        self.world_size = num_workers
        self._methods = registered_methods(worker_cls)
        resources = resources or ResourceManager.cpu_only()
        remote_cls = ray.remote(worker_cls)
        tag = uuid.uuid4().hex[:6]
        self.workers = []
        for rank in range(num_workers):
            options = resources.actor_options(role, rank)
            options["name"] = f"{role}_{rank}_{tag}"
            self.workers.append(
                remote_cls.options(**options).remote(
                    role=role,
                    rank=rank,
                    world_size=num_workers,
                    env_vars=dict(env_vars or {}),
                    **(init_kwargs or {}),
                )
            )
        # rank 0 is the rendezvous point of torch.distributed inside the role
        addr, port = self._call_ranks("master_address", [0], ((), {}), lambda r: r[0]).get()
        self._call_ranks("set_master", list(range(num_workers)), ((addr, port), {}), list).get()

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
        pieces = data.chunk(self.world_size)
        calls = [(r, p) for r, p in zip(ranks, pieces) if len(p) > 0] or [(0, pieces[0])]
        refs = []
        for rank, piece in calls:
            a, k = ((piece, *rest), kwargs) if key is None else (rest, {**kwargs, key: piece})
            refs.append(getattr(self.workers[rank], method).remote(*a, **k))
        return PendingCall(self.role, method, [r for r, _ in calls], refs, _concat_results)

    def _call_ranks(self, method: str, ranks: list[int], call_args: tuple, gather: Callable) -> PendingCall:
        args, kwargs = call_args
        refs = [getattr(self.workers[r], method).remote(*args, **kwargs) for r in ranks]
        return PendingCall(self.role, method, ranks, refs, gather)

    def shutdown(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w, no_restart=True)
        self.workers = []


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
