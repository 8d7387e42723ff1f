"""Typed clients of the worker roles: how the driver calls train, reference, rollout and env workers.

A ``Cluster`` is the transport (N actors of one worker class, a call fanned out by the method's dispatch
mode); it finds the method by name, so mypy can check nothing through it. The pipelines call the workers
only through these clients instead: each method has the worker method's own parameters and the gathered
result's type, so a wrong argument is flagged where the pipeline writes the call. Each client names its
worker's method by the method itself (``_submit(TrainWorker.train_step, ...)``, a ParamSpec), so mypy also
checks the client against the worker. What a call asks besides the batch is a typed request
(``protocol/requests.py``), never a string in ``meta_info``. ``async_*`` methods return the call in
flight (``Call.get()`` waits and gathers).

Without Ray, a client takes any ``Transport`` (tests: a fake cluster that calls one plain worker).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

from roll_ma.distributed.worker import Worker
from roll_ma.inference.infer_backend import Generator, SleepLevel
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import PairReference, ScoreRequest, UpdateRequest, UpdateResult
from roll_ma.workers.env_worker import EnvWorker, EpisodeSpec
from roll_ma.workers.reference_worker import ReferenceWorker
from roll_ma.workers.rollout_worker import RolloutWorker
from roll_ma.workers.train_worker import TrainWorker

if TYPE_CHECKING:
    from ray import ObjectRef

P = ParamSpec("P")
T_co = TypeVar("T_co", covariant=True)


class Call(Protocol[T_co]):
    """A call in flight (``distributed.cluster.PendingCall``): ``get`` waits, returns the gathered result."""

    def get(self, timeout: float | None = None) -> T_co: ...


class Transport(Protocol):
    """What a client needs of a ``Cluster``: its role, its size, and a call by method name."""

    role: str
    world_size: int

    def dispatch(self, method: str, *args: Any, **kwargs: Any) -> Call[Any]: ...


def _submit(cluster: Transport, method: Callable[Concatenate[Any, P], Any], *args: P.args,
            **kwargs: P.kwargs) -> Call[Any]:
    """Call ``method`` (a worker method, unbound) on ``cluster``'s ranks; mypy checks the arguments
    against the worker's own signature."""
    return cluster.dispatch(method.__name__, *args, **kwargs)


class _Client:
    def __init__(self, cluster: Transport):
        self.cluster = cluster

    @property
    def world_size(self) -> int:
        return self.cluster.world_size

    def node_ids(self) -> list[str]:
        """The Ray node of each rank (rank order)."""
        return list(_submit(self.cluster, Worker.node_id).get())


class TrainClient(_Client):
    """The train workers (``TrainWorker``): score, update, export, checkpoint. Every rank holds every
    adapter; an update goes to all ranks with the whole batch, scoring is split over them."""

    def init_model(self, total_steps: int | None = None) -> None:
        _submit(self.cluster, TrainWorker.init_model, total_steps).get()

    def compute_log_probs(self, data: DataProto, request: ScoreRequest) -> DataProto:
        """``old_log_probs`` (B, R): each row under its agent's adapter."""
        return _submit(self.cluster, TrainWorker.compute_log_probs, data, request).get()

    def compute_ref_log_probs(self, data: DataProto, request: ScoreRequest) -> DataProto:
        """``ref_log_probs`` (B, R) with every adapter off (``reference.mode=train_worker``)."""
        return _submit(self.cluster, TrainWorker.compute_ref_log_probs, data, request).get()

    def compute_values(self, data: DataProto) -> DataProto:
        """``values`` (B, R): each row under its agent's critic."""
        return _submit(self.cluster, TrainWorker.compute_values, data).get()

    def train_step(self, data: DataProto, request: UpdateRequest) -> UpdateResult:
        """One update as ``request`` says; what it updated and its metrics (every rank reports the same:
        rank 0's)."""
        return _submit(self.cluster, TrainWorker.train_step, data, request).get()[0]

    def train_and_export(self, data: DataProto | ObjectRef[DataProto], policy: str, request: UpdateRequest,
                         dtype: str | None, transport: str) -> tuple[UpdateResult, Any, float]:
        """Update ``policy`` alone, then export it if it changed: (result, payload or None, seconds).
        ``data`` may be a ref of Ray's object store to a DataProto (put once for several policies)."""
        # not _submit: a ref reaches the worker as the DataProto it holds (Ray resolves top-level refs)
        result, *export = self.cluster.dispatch(TrainWorker.train_and_export.__name__, data, policy, request,
                                                dtype, transport).get()[0]
        payload, seconds = export  # rank 0 answers [result, payload, seconds]
        return result, payload, float(seconds)

    def compute_pair_ref_log_probs(self, data: DataProto, reference: PairReference) -> DataProto:
        """DPO pairs: ``ref_chosen_logps`` / ``ref_rejected_logps`` (N,) under ``reference``."""
        return _submit(self.cluster, TrainWorker.compute_pair_ref_log_probs, data, reference).get()

    def snapshot_reference(self) -> list[str]:
        """Freeze every trainable adapter into its reference copy; the adapters copied (rank 0's list)."""
        return _submit(self.cluster, TrainWorker.snapshot_reference).get()[0]

    def reset_optimizers(self, lr: float | None = None) -> None:
        _submit(self.cluster, TrainWorker.reset_optimizers, lr).get()

    def flops_profile(self) -> dict[str, Any]:
        return _submit(self.cluster, TrainWorker.flops_profile).get()

    def gpu_memory_used_gb(self) -> float:
        return _submit(self.cluster, TrainWorker.gpu_memory_used_gb).get()

    def score_with(self, scorer: Callable[..., DataProto], data: DataProto) -> DataProto:
        """A study's forward-only pass over the policies on rank 0 (``TrainWorker.score_with``)."""
        return _submit(self.cluster, TrainWorker.score_with, scorer, data).get()

    def train_with(self, trainer: Callable[..., dict[str, float]], data: DataProto,
                   *args: Any) -> dict[str, float]:
        """A study's update of the policies on every rank (``TrainWorker.train_with``); rank 0's metrics."""
        return _submit(self.cluster, TrainWorker.train_with, trainer, data, *args).get()[0]

    def export_adapters(self, adapters: list[str] | None, dtype: str | None = None,
                        transport: str = "ray") -> tuple[Any, float]:
        """The adapters packed for the engines: (payload, seconds) (``TrainWorker.export_adapters``)."""
        call = _submit(self.cluster, TrainWorker.export_adapters, adapters, dtype, transport)
        payload, seconds = call.get()
        return payload, float(seconds)

    def release_exports(self, segments: list[str] | None = None) -> int:
        return _submit(self.cluster, TrainWorker.release_exports, segments).get()

    def save_checkpoint(self, ckpt_dir: str) -> None:
        _submit(self.cluster, TrainWorker.save_checkpoint, ckpt_dir).get()

    def load_checkpoint(self, ckpt_dir: str) -> None:
        _submit(self.cluster, TrainWorker.load_checkpoint, ckpt_dir).get()


class ReferenceClient(_Client):
    """The reference workers (``ReferenceWorker``, ``reference.mode=worker``): the base model alone."""

    def init_model(self) -> None:
        _submit(self.cluster, ReferenceWorker.init_model).get()

    def compute_ref_log_probs(self, data: DataProto, request: ScoreRequest) -> DataProto:
        """``ref_log_probs`` (B, R) from the base."""
        return _submit(self.cluster, ReferenceWorker.compute_ref_log_probs, data, request).get()


class RefScorer(Protocol):
    """Who computes reference log-probs: the reference workers, or the train workers with adapters off."""

    @property
    def world_size(self) -> int: ...

    def compute_ref_log_probs(self, data: DataProto, request: ScoreRequest) -> DataProto: ...


class RolloutClient(_Client):
    """The rollout workers (``RolloutWorker``): one engine each, serving every agent's adapter."""

    def init_model(self, initial_adapters: bool = True) -> None:
        _submit(self.cluster, RolloutWorker.init_model, initial_adapters).get()

    def update_adapters(self, tensors: dict[str, Any], version: int) -> list[dict[str, float]]:
        """Install ``tensors`` under ``version`` on every rank; each rank's install seconds per adapter."""
        return self.async_update_adapters(tensors, version).get()

    def async_update_adapters(self, tensors: dict[str, Any], version: int) -> Call[list[dict[str, float]]]:
        return _submit(self.cluster, RolloutWorker.update_adapters, tensors, version)

    def last_sync_profile(self) -> dict[str, float]:
        return _submit(self.cluster, RolloutWorker.last_sync_profile).get()

    def adapter_versions(self) -> list[dict[str, int]]:
        """Each rank's adapter -> version served (rank order)."""
        return _submit(self.cluster, RolloutWorker.adapter_versions).get()

    def sleep(self, level: SleepLevel = 1) -> None:
        _submit(self.cluster, RolloutWorker.sleep, level).get()

    def wake_up(self) -> None:
        _submit(self.cluster, RolloutWorker.wake_up).get()

    def record_generate_calls(self, on: bool = True) -> None:
        """Benchmarks (vllm): record the generate calls for ``replay_generate_calls``."""
        _submit(self.cluster, RolloutWorker.record_generate_calls, on).get()

    def replay_generate_calls(self) -> dict[str, float]:
        return _submit(self.cluster, RolloutWorker.replay_generate_calls).get()


# what env workers may play against in place of the rollout workers (``workers/replay.py``)
RolloutStandIn = Generator
Rollout = RolloutClient | RolloutStandIn  # what env workers generate with


class EnvClient(_Client):
    """The env (or workflow) workers: each plays its share of the episodes against a rollout."""

    def run_episodes(self, rollout: Rollout, assignments: list[list[EpisodeSpec]], step: int,
                     greedy: bool = False, seats: list[str] | None = None) -> list[DataProto]:
        """Every env worker's rows (``assignments[i]``: worker i's episodes), in worker order."""
        return self.async_run_episodes(rollout, assignments, step, greedy, seats).get()

    def async_run_episodes(self, rollout: Rollout, assignments: list[list[EpisodeSpec]], step: int,
                           greedy: bool = False, seats: list[str] | None = None) -> Call[list[DataProto]]:
        # the env workers call the rollout's engines themselves: they get the transport, not the client
        target = rollout.cluster if isinstance(rollout, RolloutClient) else rollout
        return _submit(self.cluster, EnvWorker.run_episodes, target, assignments, step, greedy, seats)
