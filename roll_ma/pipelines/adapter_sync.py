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
        if self.transport == "shm":
            self.workers.train.release_exports()  # every engine has copied the files out
        metrics["timing/sync_per_adapter"] = (time.perf_counter() - start) / len(names)
        metrics["timing/sync_export_pack"] = float(pack_s)
        metrics.update({f"timing/sync_install_{k.removesuffix('_s')}": float(v)
                        for k, v in self.workers.rollout.last_sync_profile().items()})
        metrics.update({f"timing/sync/{name}": float(s) for name, s in (engine_s or {}).items()})
        served = self.workers.rollout.adapter_versions()
        wrong = {a: v for a, v in served.items() if a in names and v != version}
        if wrong:
            raise RuntimeError(f"rollout engine reports adapter versions {wrong} after the sync of version "
                               f"{version}")
        return metrics
