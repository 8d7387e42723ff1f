"""A Cluster without Ray, for the typed clients (``roll_ma.workers.clients``) in unit tests.

``LocalCluster(worker, TrainWorker)`` answers ``dispatch(method, ...)`` as a Cluster of one rank would:
it calls ``worker``'s method (a real worker, or a fake with the same methods) with the arguments as they
are, and gathers by the method's ``@register`` mode on the worker class (one_to_all: a list of the one
rank's result; rank_zero and dp modes: the result). A method the class does not register is refused, as
a Cluster refuses it. ``calls`` records every (method, args, kwargs).
"""

from __future__ import annotations

from typing import Any

from roll_ma.distributed.worker import Dispatch, registered_methods


class Done:
    """A call that already ran (``Call``): ``get`` returns its result."""

    def __init__(self, result: Any):
        self.result = result

    def get(self, timeout: float | None = None) -> Any:
        return self.result


class LocalCluster:
    def __init__(self, worker: Any, worker_cls: type, role: str = "local"):
        self.worker, self.role, self.world_size = worker, role, 1
        self.modes = registered_methods(worker_cls)
        self.calls: list[tuple[str, tuple, dict]] = []

    def dispatch(self, method: str, *args: Any, **kwargs: Any) -> Done:
        if method not in self.modes:
            raise AttributeError(f"{self.role} workers have no registered method {method!r}")
        self.calls.append((method, args, kwargs))
        result = getattr(self.worker, method)(*args, **kwargs)
        return Done([result] if self.modes[method] is Dispatch.ONE_TO_ALL else result)
