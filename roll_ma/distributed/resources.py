"""Which GPUs each role gets, as one Ray placement group, and the actor options that pin workers to it.

A role maps to a list of GPU indices (``resources.device_mapping``; default: every role on GPUs 0..n-1,
colocated). Rank i of a role takes ``k`` consecutive entries: one GPU for train and reference ranks,
``rollout.tensor_parallel`` GPUs for a rollout engine (``roll_ma.distributed.placement``). The placement
group holds one bundle per GPU (``{"GPU": 1, "CPU": c}``), and one bundle of ``k`` GPUs per
tensor-parallel engine. Roles that share a GPU are colocated: each asks Ray for an equal fraction of it,
and Ray sets CUDA_VISIBLE_DEVICES of the actor to that GPU.

One host or several nodes: the group is packed (``PACK``), so Ray puts the bundles on as few nodes as
it can: all of them on a single host, spread over the nodes of a cluster when one node has too few
GPUs. A bundle always lies on one node, so colocated roles and an engine's tensor-parallel GPUs stay
together. ``resources.role_resources`` pins roles to nodes: every worker of the role asks for those Ray
custom resources (``ray start --resources='{"inference": 8}'`` on the nodes meant for it), and with GPUs
the worker's bundle reserves them, so Ray can only place that bundle on such a node.
"""

from __future__ import annotations

import os
from typing import Any

from roll_ma.config.schema import ResourcesConfig
from roll_ma.distributed.placement import (
    bundle_specs,
    default_device_mapping,
    gpu_shares,
    placement_bundles,
    worker_gpus,
)
from roll_ma.distributed.ray_health import ray_responds

GPU_ROLES = ("rollout", "train", "reference", "teacher")

__all__ = ["GPU_ROLES", "ResourceManager", "default_device_mapping", "gpu_shares", "usable_cpus"]


def usable_cpus() -> int:
    """Cores this process may run on: its affinity mask (taskset, a cpuset), not the host's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity masks
        return os.cpu_count() or 1


class ResourceManager:
    """Placement of role workers; CPU-only when no GPU is configured.

    Args:
        num_gpus: GPUs of the run (0: no placement group; workers ask for CPUs only).
        device_mapping: role -> GPU indices, complete (``placement.default_device_mapping``).
        num_cpus_per_worker: CPUs each actor asks for.
        placement_timeout_s: how long Ray may take to reserve every bundle.
        gpus_per_worker: role -> GPUs per worker (tensor-parallel engines); 1 when not named.
        role_resources: role -> Ray custom resources each of its workers asks for (pins roles to nodes).
    """

    def __init__(
        self,
        num_gpus: int,
        device_mapping: dict[str, list[int]],
        num_cpus_per_worker: float = 0.1,
        placement_timeout_s: float = 120.0,
        gpus_per_worker: dict[str, int] | None = None,
        role_resources: dict[str, dict[str, float]] | None = None,
    ):
        self.num_gpus = num_gpus
        self.device_mapping = {r: list(g) for r, g in device_mapping.items()}
        self.num_cpus_per_worker = num_cpus_per_worker
        self.gpus_per_worker = {r: int(k) for r, k in (gpus_per_worker or {}).items()}
        self.role_resources = {r: dict(v) for r, v in (role_resources or {}).items() if v}
        self.placement_group = None
        self.gpu_fraction = gpu_shares(self.device_mapping)
        self.bundle_gpus = placement_bundles(num_gpus, self.device_mapping, self.gpus_per_worker)
        self._bundle_of = {g: i for i, group in enumerate(self.bundle_gpus) for g in group}
        if num_gpus > 0:
            import ray
            from ray.util.placement_group import placement_group, remove_placement_group

            specs = self.bundle_specs()
            self.placement_group = placement_group(specs, strategy="PACK")
            ready, _ = ray.wait([self.placement_group.ready()], timeout=placement_timeout_s)
            if not ready:
                remove_placement_group(self.placement_group)  # a pending group would stay queued in Ray
                self.placement_group = None
                raise RuntimeError(self._unplaced(specs, placement_timeout_s))

    def _unplaced(self, specs: list[dict[str, float]], timeout_s: float) -> str:
        import ray

        pinned = f" and the custom resources of resources.role_resources {self.role_resources}" \
            if self.role_resources else ""
        have = ray.cluster_resources().get("GPU", 0)
        return (
            f"Ray could not place {len(specs)} GPU bundles {specs} within {timeout_s:.0f} s; the cluster "
            f"has {have:.0f} GPUs. Each bundle must fit on one node with its GPUs{pinned}. "
            "Lower resources.num_gpus (or rollout.tensor_parallel), add nodes, or start nodes with the "
            "custom resources the roles ask for."
        )

    @classmethod
    def cpu_only(
        cls, num_cpus_per_worker: float = 0.1, role_resources: dict[str, dict[str, float]] | None = None
    ) -> ResourceManager:
        return cls(0, {}, num_cpus_per_worker, role_resources=role_resources)

    @classmethod
    def from_config(
        cls, res: ResourcesConfig, workers: dict[str, int], gpus_per_worker: dict[str, int] | None = None
    ) -> ResourceManager:
        per = {r: k for r, k in (gpus_per_worker or {}).items() if workers.get(r, 0) > 0}
        mapping = default_device_mapping(res.num_gpus, workers, per, res.device_mapping)
        return cls(res.num_gpus, mapping, res.num_cpus_per_worker, gpus_per_worker=per,
                   role_resources=res.role_resources)

    def bundle_specs(self) -> list[dict[str, float]]:
        """The Ray bundles of the placement group (``placement.bundle_specs``)."""
        return bundle_specs(self.bundle_gpus, self.device_mapping, self.gpus_per_worker,
                            self.num_cpus_per_worker, self.role_resources)

    def release(self) -> None:
        """Give the GPU bundles back to Ray: a later run in the same process (a notebook, a sweep) can
        place its own; without this the bundles stay reserved until the driver exits."""
        if self.placement_group is not None:
            from ray.util.placement_group import remove_placement_group


            if ray_responds():  # else it went with its GCS (a SIGTERM to the job): asking would block
                remove_placement_group(self.placement_group)
            self.placement_group = None

    def gpus_of(self, role: str) -> list[int]:
        return self.device_mapping.get(role, [])

    def colocated(self, role_a: str, role_b: str) -> bool:
        return bool(set(self.gpus_of(role_a)) & set(self.gpus_of(role_b)))

    def actor_options(self, role: str, rank: int) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": self.num_cpus_per_worker}
        if role in self.role_resources:
            options["resources"] = dict(self.role_resources[role])
        if self.placement_group is None or not self.device_mapping.get(role):
            return {**options, "num_gpus": 0}
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        k = self.gpus_per_worker.get(role, 1)
        gpus = worker_gpus(self.device_mapping, role, rank, k)
        return {
            **options,
            # whole GPUs for an engine that spans several (Ray has no fractions of several GPUs)
            "num_gpus": float(k) if k > 1 else self.gpu_fraction[gpus[0]],
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group, placement_group_bundle_index=self._bundle_of[gpus[0]]
            ),
        }
