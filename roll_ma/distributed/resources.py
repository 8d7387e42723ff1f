"""Which GPUs each role gets, as Ray placement groups and actor options.

One bundle per GPU (``{"GPU": 1, "CPU": c}``). A role maps to a list of bundle indices
(``resources.device_mapping``); rank i of the role runs in bundle ``mapping[i]``. Roles that
share a GPU are colocated: each asks Ray for an equal fraction of it, and Ray sets
CUDA_VISIBLE_DEVICES of the actor to that GPU.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

from roll_ma.config.schema import ResourcesConfig

GPU_ROLES = ("rollout", "train", "reference", "teacher")


def usable_cpus() -> int:
    """Cores this process may run on: its affinity mask (taskset, a cpuset), not the host's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity masks
        return os.cpu_count() or 1


def gpu_shares(device_mapping: dict[str, list[int]]) -> dict[int, float]:
    """GPU index -> fraction each actor on it asks for (floored to 1/100 so the shares fit in one GPU)."""
    share = Counter(g for gpus in device_mapping.values() for g in gpus)
    return {g: int(100 / n) / 100 for g, n in share.items()}


def default_device_mapping(num_gpus: int, workers: dict[str, int]) -> dict[str, list[int]]:
    """Every GPU role on GPUs 0..n-1 (colocated), n = its worker count."""
    return {role: list(range(n)) for role, n in workers.items() if n > 0 and num_gpus > 0}


class ResourceManager:
    """Placement of role workers; CPU-only when no GPU is configured."""

    def __init__(
        self,
        num_gpus: int,
        device_mapping: dict[str, list[int]],
        num_cpus_per_worker: float = 0.1,
        placement_timeout_s: float = 120.0,
    ):
        self.num_gpus = num_gpus
        self.device_mapping = {r: list(g) for r, g in device_mapping.items()}
        self.num_cpus_per_worker = num_cpus_per_worker
        self.placement_group = None
        self.gpu_fraction = gpu_shares(self.device_mapping)
        if num_gpus > 0:
            import ray
            from ray.util.placement_group import placement_group

            bundles = [
                {"GPU": 1, "CPU": max(1.0, num_cpus_per_worker * len(GPU_ROLES))} for _ in range(num_gpus)
            ]
            self.placement_group = placement_group(bundles, strategy="PACK")
            ready, _ = ray.wait([self.placement_group.ready()], timeout=placement_timeout_s)
            if not ready:
                raise RuntimeError(
                    f"Ray could not place {num_gpus} GPU bundles within {placement_timeout_s:.0f} s; "
                    f"the cluster has {ray.cluster_resources().get('GPU', 0):.0f} GPUs. "
                    "Lower resources.num_gpus or add nodes."
                )

    @classmethod
    def cpu_only(cls, num_cpus_per_worker: float = 0.1) -> ResourceManager:
        return cls(0, {}, num_cpus_per_worker)

    @classmethod
    def from_config(cls, res: ResourcesConfig, workers: dict[str, int]) -> ResourceManager:
        mapping = dict(default_device_mapping(res.num_gpus, workers))
        mapping.update({r: g for r, g in res.device_mapping.items() if workers.get(r, 0) > 0})
        mapping = {r: g for r, g in mapping.items() if workers.get(r, 0) > 0}
        return cls(res.num_gpus, mapping, res.num_cpus_per_worker)

    def release(self) -> None:
        """Give the GPU bundles back to Ray: a later run in the same process (a notebook, a sweep) can
        place its own; without this the bundles stay reserved until the driver exits."""
        if self.placement_group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.placement_group)
            self.placement_group = None

    def gpus_of(self, role: str) -> list[int]:
        return self.device_mapping.get(role, [])

    def colocated(self, role_a: str, role_b: str) -> bool:
        return bool(set(self.gpus_of(role_a)) & set(self.gpus_of(role_b)))

    def actor_options(self, role: str, rank: int) -> dict[str, Any]:
        gpus = self.device_mapping.get(role)
        if self.placement_group is None or not gpus:
            return {"num_cpus": self.num_cpus_per_worker, "num_gpus": 0}
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if rank >= len(gpus):
            raise ValueError(
                f"{role} rank {rank} has no GPU: resources.device_mapping.{role} lists {len(gpus)}"
            )
        bundle = gpus[rank]
        return {
            "num_cpus": self.num_cpus_per_worker,
            "num_gpus": self.gpu_fraction[bundle],
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=self.placement_group, placement_group_bundle_index=bundle
            ),
        }
