"""How old each row's adapter is when the trainer uses it, and the rows too old to train on.

Every row carries the version of its agent's adapter that generated it (``adapter_version``, the
step whose update produced it). When the trainer takes the row, its agent's adapter is at version
``current``; the row's staleness is ``current - version``. The synchronous loop trains on rows of
staleness 0 only (anything else is a sync bug and stops the run, ``pipelines/rl/step.py``); the
asynchronous loop (``rollout.max_staleness = k``) drops the rows of staleness > k and trains on
the rest with the decoupled objective.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from roll_ma.protocol import DataProto


def staleness_of_rows(batch: DataProto, adapter_of_agent: list[str], current: dict[str, int]) -> np.ndarray:
    """(B,) current version of each row's adapter minus the version that generated the row."""
    agent_ids = batch.non_tensor["agent_id"].astype(int)
    versions = batch.non_tensor["adapter_version"].astype(int)
    now = np.array([current[adapter_of_agent[a]] for a in agent_ids], dtype=np.int64)
    return now - versions


def drop_stale_rows(
    batch: DataProto, agent_names: list[str], adapter_of_agent: list[str], current: dict[str, int], limit: int
) -> tuple[DataProto, dict[str, float]]:
    """The rows of staleness <= ``limit``, and the metrics: per agent ``staleness_max`` /
    ``staleness_mean`` (of the rows generated), ``rollout/dropped_stale_rows``, and
    ``rollout/mixed_version_episodes`` (the share of episodes whose rows came from more than one
    adapter version: an install landed between two of its turns, or its agents were at different
    versions)."""
    staleness = staleness_of_rows(batch, adapter_of_agent, current)  # (B,)
    if (staleness < 0).any():
        raise RuntimeError("rows report adapter versions newer than the trainer's: the sync is broken")
    agent_ids = batch.non_tensor["agent_id"].astype(int)
    metrics: dict[str, float] = {}
    for aid, name in enumerate(agent_names):
        rows = agent_ids == aid
        if rows.any():
            metrics[f"agent/{name}/staleness_max"] = float(staleness[rows].max())
            metrics[f"agent/{name}/staleness_mean"] = float(staleness[rows].mean())
    episode_versions: dict[str, set[int]] = defaultdict(set)
    rows = zip(batch.non_tensor["episode_id"], batch.non_tensor["adapter_version"], strict=True)
    for episode, version in rows:
        episode_versions[str(episode)].add(int(version))
    mixed = sum(len(v) > 1 for v in episode_versions.values())
    metrics["rollout/mixed_version_episodes"] = mixed / max(len(episode_versions), 1)
    keep = np.nonzero(staleness <= limit)[0]
    metrics["rollout/dropped_stale_rows"] = float(len(batch) - len(keep))
    return (batch if len(keep) == len(batch) else batch.select_idxs(keep)), metrics
