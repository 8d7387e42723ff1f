"""Pushing the trainer's adapters into every rollout engine, versioned and checked.

One sync: the train worker packs the adapters that changed (cast to the engine's dtype on the GPU)
and hands them over, the rollout workers install them under version = step, and the engines'
reported versions are checked. The hand-over is a shared-memory segment per adapter when every
rollout worker runs on the train worker's node (colocated, or a single host), else Ray's object
store; the adapters never pass through the driver.

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
from roll_ma.strategies.rollout_common import adapter_sync_dtype

Timer = Callable[[str], AbstractContextManager]


class AdapterSync:
    """Adapter pushes of one run (``workers``: a ``RunWorkers``)."""

    def __init__(self, cfg: RunConfig, workers: Any):
        self.workers = workers
        self.dtype = adapter_sync_dtype(cfg.rollout, cfg.model)
        train_node = workers.train.node_id()[0]
        same_node = all(n == train_node for n in workers.rollout.node_id())
        self.transport = "shm" if same_node else "ray"

    def push(self, adapters: Iterable[str], version: int, timer: Timer | None = None) -> dict[str, float]:
        """Install ``adapters`` as ``version`` in every engine; checks the engines report that version."""
        names = sorted(adapters)
        timed = timer or (lambda _name: nullcontext())
        metrics: dict[str, float] = {"rollout/adapters_synced": float(len(names))}
        if not names:
            return metrics
        start = time.perf_counter()
        with timed("sync_export"):
            payload, pack_s = self.workers.train.export_adapters(names, self.dtype, self.transport)
        with timed("sync_install"):
            engine_s = self.workers.rollout.update_adapters(payload, version)[0]
        if self.transport == "shm":  # every engine has copied the files out
            self.workers.train.release_exports([p.segment for p in payload.values()])
        metrics["timing/sync_per_adapter"] = (time.perf_counter() - start) / len(names)
        metrics["timing/sync_export_pack"] = float(pack_s)
        metrics.update({f"timing/sync_install_{k.removesuffix('_s')}": float(v)
                        for k, v in self.workers.rollout.last_sync_profile().items()})
        metrics.update({f"timing/sync/{name}": float(s) for name, s in (engine_s or {}).items()})
        self.check_versions(names, version)
        return metrics

    def stream(self, batch: Any, adapters: list[str], version: int, timer: Timer | None = None
               ) -> tuple[dict[str, float], list[str]]:
        """Update ``adapters`` one after another (the asynchronous loop), pushing each to every engine as
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
        pending: list[tuple[str, Any, Any]] = []  # (adapter, install call, payload)
        with timed("update"):
            for name in adapters:
                first, *_ = self.workers.train.train_and_export(batch_ref, name, self.dtype, self.transport)
                part, payload, pack_s = first
                metrics.update(part)
                if payload is not None:  # it changed: out to every engine at once, without waiting
                    call = self.workers.rollout.dispatch("update_adapters", payload, version)
                    pending.append((name, call, payload))
                    metrics["timing/sync_export_pack"] = metrics.get("timing/sync_export_pack", 0.0) + pack_s
        with timed("sync"):
            for _name, call, payload in pending:
                engine_s = call.get()[0]
                metrics.update({f"timing/sync/{n}": float(s) for n, s in (engine_s or {}).items()})
                if self.transport == "shm":
                    self.workers.train.release_exports([p.segment for p in payload.values()])
            names = [name for name, _, _ in pending]
            self.check_versions(names, version)
        metrics["rollout/adapters_synced"] = float(len(names))
        return metrics, names

    def check_versions(self, names: list[str], version: int) -> None:
        """Every engine must serve ``names`` as ``version`` now."""
        for rank, served in enumerate(self.workers.rollout.all_adapter_versions()):
            wrong = {a: v for a, v in served.items() if a in names and v != version}
            if wrong:
                raise RuntimeError(f"rollout engine {rank} reports adapter versions {wrong} after the sync "
                                   f"of version {version}")
