"""Whether the Ray this process is connected to still answers: asked before any call that would need a GCS
a stop signal may have taken down (the run's teardown, a placement group's release). Imports only Ray, so
that ray_env, resources and cluster can all ask it."""

from __future__ import annotations

import contextlib
from typing import Any


class _Silent:
    """The GCS addresses found not answering, by this process: each ask of a stopped GCS waits its timeout,
    and one that stopped does not come back (state of the driver process, read only by ``ray_responds``)."""

    addresses: set[str] = set()


def ray_responds(timeout_s: float = 2.0) -> bool:
    """Whether the Ray this process is connected to answers within ``timeout_s``. A signal to every process
    of a job (Slurm's scancel, a container's stop) stops the local Ray's GCS with the driver; every call
    that needs the GCS then blocks for 60 s and exits the process."""
    import ray

    if not ray.is_initialized():
        return False
    gcs: Any = None
    try:
        from ray.experimental import internal_kv

        gcs = internal_kv.global_gcs_client
        if gcs.address in _Silent.addresses:
            return False
        gcs.internal_kv_exists(b"roll_ma_probe", b"roll_ma", timeout=timeout_s)
    except Exception:  # noqa: BLE001 - any failure: no answer
        with contextlib.suppress(Exception):
            _Silent.addresses.add(gcs.address)
        return False
    return True
