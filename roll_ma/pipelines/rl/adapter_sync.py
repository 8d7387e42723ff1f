"""Pushing the trainer's adapters into every rollout engine, versioned and checked.

One sync: train rank 0 packs the adapters that changed (cast to the engine's dtype on the GPU) and
hands them over, EVERY rollout worker (each one engine, data parallel) installs them under version =
step, and every engine's reported versions are checked (``check_versions``: a stale engine of any rank
stops the run). The hand-over is a shared-memory file per adapter when every rollout worker runs on
train rank 0's Ray node (colocated, or a single host), else Ray's object store: one copy put by the
train worker, pulled by each node that holds a rollout worker (``system/sync_object_store`` = 1); the
adapters never pass through the driver. The run prints which one it chose.

Timings (seconds, into the step's metrics): ``timing/sync_per_adapter`` (export + install, wake-up
excluded, over the adapters pushed), ``timing/sync_export`` (pack + hand-over, the driver's wall),
``timing/sync_export_pack`` (the train worker's own part of it), ``timing/sync_install`` (every
engine installed, the driver's wall), ``timing/sync_install_worker`` / ``_rpc`` (rank 0's rollout
worker: all of its part / the call into vLLM's worker), ``timing/sync/<adapter>`` (the engine's own
install of one adapter).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from roll_ma.config.schema import RunConfig
from roll_ma.inference.rollout_common import adapter_sync_dtype
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import UpdateRequest
from roll_ma.workers.clients import Call, RolloutClient, TrainClient

Timer = Callable[[str], AbstractContextManager]


class AdapterSync:
    """Adapter pushes of one run: from the train workers (``train``) into the engines (``rollout``)."""

    def __init__(self, cfg: RunConfig, train: TrainClient, rollout: RolloutClient):
        self.train, self.rollout = train, rollout
        self.dtype = adapter_sync_dtype(cfg.rollout, cfg.model)
        train_node = train.node_ids()[0]
        elsewhere = {n for n in rollout.node_ids() if n != train_node}
        self.transport = "ray" if elsewhere else "shm"
        how = (f"Ray's object store (rollout workers on {len(elsewhere)} node(s) other than train rank 0's)"
               if elsewhere else "shared-memory files (every rollout worker on train rank 0's node)")
        print(f"[roll_ma] adapter sync through {how}", flush=True)

    def push(self, adapters: Iterable[str], version: int, timer: Timer | None = None) -> dict[str, float]:
        """Install ``adapters`` as ``version`` in every engine; checks the engines report that version."""
        names = sorted(adapters)
        timed = timer or (lambda _name: nullcontext())
        metrics: dict[str, float] = {"rollout/adapters_synced": float(len(names)),
                                     "system/sync_object_store": float(self.transport == "ray")}
        if not names:
            return metrics
        start = time.perf_counter()
        with timed("sync_export"):
            payload, pack_s = self.train.export_adapters(names, self.dtype, self.transport)
        with timed("sync_install"):
            engine_s = self.rollout.update_adapters(payload, version)[0]
        if self.transport == "shm":  # every engine has copied the files out
            self.train.release_exports([p.segment for p in payload.values()])
        metrics["timing/sync_per_adapter"] = (time.perf_counter() - start) / len(names)
        metrics["timing/sync_export_pack"] = float(pack_s)
        metrics.update({f"timing/sync_install_{k.removesuffix('_s')}": float(v)
                        for k, v in self.rollout.last_sync_profile().items()})
        metrics.update({f"timing/sync/{name}": float(s) for name, s in (engine_s or {}).items()})
        check_versions(self.rollout.adapter_versions(), names, version)
        return metrics

    def stream(self, batch: DataProto, request: UpdateRequest, adapters: list[str], version: int,
               timer: Timer | None = None) -> tuple[dict[str, float], list[str]]:
        """Update ``adapters`` one after another as ``request`` says (the asynchronous loop; each call
        updates one policy), pushing each to every engine as
        soon as its own update ends: the install runs (between the engines' generate calls) while the
        trainer goes on with the next adapter. Returns the updates' metrics plus the sync's, and the
        adapters pushed (those that took an optimizer step).

        ``timing/update`` covers the updates (and the exports), ``timing/sync`` what is left of the
        installs after the last update.
        """
        import ray

        timed = timer or (lambda _name: nullcontext())
        metrics: dict[str, float] = {}
        batch_ref = ray.put(batch)  # one copy in the object store, read by every update call
        pending: list[tuple[str, Call[list[dict[str, float]]], Any]] = []  # (adapter, install call, payload)
        with timed("update"):
            for name in adapters:
                part, payload, pack_s = self.train.train_and_export(batch_ref, name, request, self.dtype,
                                                                    self.transport)
                metrics.update(part.metrics)
                if payload is not None:  # it changed: out to every engine at once, without waiting
                    call = self.rollout.async_update_adapters(payload, version)
                    pending.append((name, call, payload))
                    metrics["timing/sync_export_pack"] = metrics.get("timing/sync_export_pack", 0.0) + pack_s
        with timed("sync"):
            for _name, call, payload in pending:
                engine_s = call.get()[0]
                metrics.update({f"timing/sync/{n}": float(s) for n, s in (engine_s or {}).items()})
                if self.transport == "shm":
                    self.train.release_exports([p.segment for p in payload.values()])
            names = [name for name, _, _ in pending]
            check_versions(self.rollout.adapter_versions(), names, version)
        metrics["rollout/adapters_synced"] = float(len(names))
        return metrics, names


def check_versions(per_rank: list[dict[str, int]], names: Iterable[str], version: int) -> None:
    """Raise unless every rollout rank's engine serves ``version`` of every adapter in ``names``.

    ``per_rank``: each rank's ``adapter_versions()`` (rank order). One engine that missed the sync would
    serve its share of the next step's rows from an old adapter.
    """
    wanted = sorted(names)
    stale = {rank: {a: served.get(a) for a in wanted if served.get(a) != version}
             for rank, served in enumerate(per_rank)}
    stale = {rank: wrong for rank, wrong in stale.items() if wrong}
    if stale:
        ranks = "; ".join(f"rank {rank}: {wrong}" for rank, wrong in stale.items())
        raise RuntimeError(
            f"after the sync of version {version}, {len(stale)} of {len(per_rank)} rollout engines serve "
            f"other adapter versions ({ranks}; None = not served); this is a bug in the adapter sync"
        )
