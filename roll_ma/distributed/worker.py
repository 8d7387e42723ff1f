"""Worker base: a plain Python class that Ray turns into an actor where clusters are built.

A worker owns one strategy (a backend) and exposes methods marked with ``@register``; the
``Cluster`` that holds N copies of it calls those methods with the method's dispatch mode.
Without Ray a worker is an ordinary object, which is how the unit tests use it.

Inside Ray, a worker reports what it does (``roll_ma.distributed.activity``): every registered
method reports when it starts, returns or raises, so the driver can say what a stuck worker
did last.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

from roll_ma.distributed import activity
from roll_ma.distributed.worker_output import worker_logging

F = TypeVar("F", bound=Callable[..., Any])


class Dispatch(str, Enum):
    """How a Cluster fans a call out to its ranks and gathers the results."""

    ONE_TO_ALL = "one_to_all"  # same arguments to every rank; a list of results (rank order)
    RANK_ZERO = "rank_zero"  # only rank 0 runs; its result
    DP_COMPUTE = "dp_compute"  # the DataProto argument is split by rank; results concatenated in order
    # like DP_COMPUTE, but rows are dealt so that every rank gets about as many real tokens (scoring
    # passes: a rank's time follows its tokens); results come back in the rows' order
    DP_BALANCED = "dp_balanced"


def register(dispatch: Dispatch | str = Dispatch.ONE_TO_ALL) -> Callable[[F], F]:
    """Mark a worker method as callable through a Cluster with the given dispatch mode.

    The method reports when it starts, returns and raises (see ``roll_ma.distributed.activity``).
    """
    mode = Dispatch(dispatch)

    def mark(fn: F) -> F:
        @functools.wraps(fn)
        def reported(self: Any, *args: Any, **kwargs: Any) -> Any:
            activity.note(f"{fn.__name__}() started")
            try:
                result = fn(self, *args, **kwargs)
            except BaseException as err:
                activity.note(f"{fn.__name__}() raised {type(err).__name__}: {err}")
                raise
            activity.note(f"{fn.__name__}() returned")
            return result

        reported._roll_ma_dispatch = mode  # type: ignore[attr-defined]
        return reported  # type: ignore[return-value]

    return mark


def registered_methods(cls: type) -> dict[str, Dispatch]:
    return {
        name: fn._roll_ma_dispatch
        for name in dir(cls)
        if not name.startswith("__")
        and (fn := getattr(cls, name, None)) is not None
        and hasattr(fn, "_roll_ma_dispatch")
    }


def share_of(cluster: Any, rank: int, world_size: int) -> Any:
    """The ranks of ``cluster`` that worker ``rank`` of ``world_size`` calls (``Cluster.share``: env
    worker i drives engine i); anything without ``share`` (a local worker in tests) as it is."""
    share = getattr(cluster, "share", None)
    return share(rank, world_size) if callable(share) else cluster


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def node_ip() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except ImportError:
        pass
    return "127.0.0.1"


class Worker:
    """Base of every role worker: knows its role, rank and world size, and sets the process env.

    The env variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT,
    CUDA_VISIBLE_DEVICES) are what torch.distributed and DeepSpeed read; without all of them
    DeepSpeed falls back to MPI discovery and fails.
    """

    def __init__(self, role: str, rank: int = 0, world_size: int = 1, env_vars: dict[str, str] | None = None):
        self.role = role
        self.rank = rank
        self.world_size = world_size
        key = self._actor_name()
        if key is not None:  # inside a Ray actor: report under its name, which the Cluster knows
            activity.install(key).note(f"{type(self).__name__}.__init__() started")
            worker_logging()  # roll_ma's warnings in the form the driver keeps on the console
        os.environ.update(env_vars or {})
        os.environ["RANK"] = str(rank)
        os.environ["WORLD_SIZE"] = str(world_size)
        os.environ["LOCAL_RANK"] = "0"  # each actor sees only its own GPU(s), so its device is always cuda:0
        gpu_ids = self._ray_gpu_ids()
        if gpu_ids is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpu_ids)

    @staticmethod
    def _actor_name() -> str | None:
        try:
            import ray

            if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
                return ray.get_runtime_context().get_actor_name() or None
        except (ImportError, RuntimeError):
            pass
        return None

    @staticmethod
    def _ray_gpu_ids() -> list[Any] | None:
        try:
            import ray

            if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
                return list(ray.get_gpu_ids())
        except (ImportError, RuntimeError):
            pass
        return None

    @register(Dispatch.ONE_TO_ALL)
    def node_id(self) -> str:
        """The Ray node this worker runs on ("local" outside Ray): workers on one node share memory."""
        try:
            import ray

            if ray.is_initialized():
                return str(ray.get_runtime_context().get_node_id())
        except (ImportError, RuntimeError):
            pass
        return "local"

    def master_address(self) -> tuple[str, int]:
        """This process's node IP and a free port, used by rank 0 as the rendezvous point."""
        return node_ip(), free_port()

    def set_master(self, addr: str, port: int) -> None:
        os.environ["MASTER_ADDR"] = addr
        os.environ["MASTER_PORT"] = str(port)
        activity.note("started: waiting for its first call")

    def close(self) -> None:
        """Free what this worker holds outside its own process (shared-memory files, an engine's processes);
        the Cluster calls it before it kills the actor. Roles that hold such things override it."""

    def ping(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "rank": self.rank,
            "world_size": self.world_size,
            "pid": os.getpid(),
            **{
                k: os.environ.get(k)
                for k in (
                    "RANK",
                    "WORLD_SIZE",
                    "LOCAL_RANK",
                    "MASTER_ADDR",
                    "MASTER_PORT",
                    "CUDA_VISIBLE_DEVICES",
                )
            },
        }
