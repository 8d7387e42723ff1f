"""Start a local Ray (sized to the machine, no dashboard) or join a cluster."""

from __future__ import annotations

import logging
import os
from typing import Any

from roll_ma.distributed.resources import usable_cpus

# Variables every actor process needs; set before any library reads them.
WORKER_ENV = {
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_AUTH_MODE": "disabled",
    "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    "PYTHONUNBUFFERED": "1",
    # per-load progress bars and info logs of every actor would bury the step summaries
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
}


def init_ray(
    address: str | None = None, num_cpus: int | None = None, env_vars: dict[str, str] | None = None
) -> dict:
    """Join ``address`` (or ``RAY_ADDRESS``) if given, else start a local Ray; returns its resources."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if ray.is_initialized():
        return ray.cluster_resources()
    env = {**WORKER_ENV, **(env_vars or {})}
    address = address or os.environ.get("RAY_ADDRESS")
    kwargs: dict[str, Any] = {
        "runtime_env": {"env_vars": env},
        "logging_level": logging.WARNING,
        "log_to_driver": True,
    }
    if address:
        ray.init(address=address, **kwargs)
        where = f"joined the Ray cluster at {address}"
    else:
        # "local": always a fresh Ray of our own, even if a `ray start` cluster runs on this machine (join
        # that one with RAY_ADDRESS). Actors ask for fractions of a CPU, so a 2-core laptop fits every role.
        ray.init(address="local", num_cpus=num_cpus or max(2, usable_cpus()), include_dashboard=False,
                 **kwargs)
        where = "started a local Ray"
    res = ray.cluster_resources()
    print(
        f"[roll_ma] {where}: {res.get('CPU', 0):.0f} CPUs, {res.get('GPU', 0):.0f} GPUs, "
        f"{len(ray.nodes())} node(s)",
        flush=True,
    )
    return res


def shutdown_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
