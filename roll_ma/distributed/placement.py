"""The arithmetic of GPU placement, without Ray: which GPUs each worker gets and how they form bundles.

A role maps to a list of GPU indices (``resources.device_mapping``). A worker of the role takes ``k``
consecutive entries of that list: ``k = 1`` for train and reference ranks, ``k =
rollout.tensor_parallel`` for a rollout (or teacher) engine. The placement group has one bundle per
GPU, except that the ``k`` GPUs of a tensor-parallel engine form ONE bundle of ``k`` GPUs: Ray puts a
bundle on one node, and an actor lives in one bundle, so the engine's GPUs are on one host.

Validation (``roll_ma.preflight.validate_resources``) and the Ray side (``resources.ResourceManager``)
both use these functions, so what is checked is what is placed.
"""

from __future__ import annotations

from collections import Counter


def default_device_mapping(
    num_gpus: int, workers: dict[str, int], gpus_per_worker: dict[str, int] | None = None,
    given: dict[str, list[int]] | None = None,
) -> dict[str, list[int]]:
    """GPU indices of every role with workers: ``given`` where it names the role, else the default.

    Default: roles of one GPU per worker on GPUs 0..n-1 (colocated with each other); a tensor-parallel
    role (k > 1 GPUs per worker) on n x k GPUs of its own after every GPU the others use (an engine
    that spans several GPUs cannot take a fraction of each, so it shares none).
    """
    if num_gpus <= 0:
        return {}
    per = gpus_per_worker or {}
    given = given or {}
    active = {r: n for r, n in workers.items() if n > 0}
    mapping: dict[str, list[int]] = {}
    for role, n in active.items():
        if per.get(role, 1) == 1:
            mapping[role] = list(given.get(role, range(n)))
    taken = {g for r, gpus in given.items() if r in active for g in gpus}
    next_free = max([g + 1 for gpus in mapping.values() for g in gpus] + [g + 1 for g in taken], default=0)
    for role, n in active.items():
        k = per.get(role, 1)
        if k > 1:
            if role in given:
                mapping[role] = list(given[role])
            else:
                mapping[role] = list(range(next_free, next_free + n * k))
                next_free += n * k
    return mapping


def worker_gpus(mapping: dict[str, list[int]], role: str, rank: int, k: int = 1) -> list[int]:
    """The GPUs of ``role``'s rank ``rank`` (k per worker); [] when the role has no GPUs."""
    gpus = mapping.get(role, [])
    if not gpus:
        return []
    if (rank + 1) * k > len(gpus):
        raise ValueError(
            f"{role} rank {rank} has no GPU: resources.device_mapping.{role} lists {len(gpus)} GPUs, "
            f"{k} per worker"
        )
    return gpus[rank * k : (rank + 1) * k]


def gpu_shares(device_mapping: dict[str, list[int]]) -> dict[int, float]:
    """GPU index -> fraction each actor on it asks for (floored to 1/100 so the shares fit in one GPU)."""
    share = Counter(g for gpus in device_mapping.values() for g in gpus)
    return {g: int(100 / n) / 100 for g, n in share.items()}


def shared_tp_gpus(
    mapping: dict[str, list[int]], gpus_per_worker: dict[str, int]
) -> dict[str, dict[str, list[int]]]:
    """Tensor-parallel roles whose GPUs another role (or another of its own engines) also uses:
    role -> {other role: shared GPUs}. Empty when every engine that spans GPUs has them to itself."""
    out: dict[str, dict[str, list[int]]] = {}
    for role, k in gpus_per_worker.items():
        if k <= 1 or role not in mapping:
            continue
        mine = mapping[role]
        clashes = {other: sorted(set(mine) & set(gpus)) for other, gpus in mapping.items() if other != role}
        clashes = {o: g for o, g in clashes.items() if g}
        twice = sorted(g for g, c in Counter(mine).items() if c > 1)
        if twice:
            clashes[role] = twice
        if clashes:
            out[role] = clashes
    return out


def placement_bundles(
    num_gpus: int, mapping: dict[str, list[int]], gpus_per_worker: dict[str, int] | None = None
) -> list[list[int]]:
    """GPU groups of the placement group, by their first GPU: every tensor-parallel engine's GPUs as one
    group, every other GPU 0..num_gpus-1 alone. Assumes ``shared_tp_gpus`` found nothing."""
    per = gpus_per_worker or {}
    groups: list[list[int]] = []
    grouped: set[int] = set()
    for role, gpus in mapping.items():
        k = per.get(role, 1)
        if k > 1:
            for rank in range(len(gpus) // k):
                group = worker_gpus(mapping, role, rank, k)
                assert not grouped & set(group), f"GPUs {group} of {role} are in two engines"
                groups.append(group)
                grouped |= set(group)
    groups += [[g] for g in range(num_gpus) if g not in grouped]
    return sorted(groups, key=lambda group: group[0])


def bundle_specs(
    bundles: list[list[int]], mapping: dict[str, list[int]], gpus_per_worker: dict[str, int],
    num_cpus_per_worker: float, role_resources: dict[str, dict[str, float]],
) -> list[dict[str, float]]:
    """One Ray bundle per GPU group: its GPUs, CPUs for the actors in it (at least 1), and the custom
    resources (``resources.role_resources``) of every worker placed in it, summed."""
    bundle_of = {g: i for i, group in enumerate(bundles) for g in group}
    actors: list[Counter] = [Counter() for _ in bundles]
    for role, gpus in mapping.items():
        k = gpus_per_worker.get(role, 1)
        for rank in range(len(gpus) // k):
            actors[bundle_of[worker_gpus(mapping, role, rank, k)[0]]][role] += 1
    specs = []
    for group, roles in zip(bundles, actors):
        spec = {"GPU": float(len(group)), "CPU": max(1.0, num_cpus_per_worker * sum(roles.values()))}
        for role, count in roles.items():
            for name, amount in role_resources.get(role, {}).items():
                spec[name] = spec.get(name, 0.0) + amount * count
        specs.append(spec)
    return specs
