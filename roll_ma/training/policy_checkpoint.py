"""policy_checkpoint: what a checkpoint of the policy set holds, written and read back (a collaborator of
``policy_set.PolicySet``, which keeps only the calls; this module reads the set's parts, never the set).

A checkpoint folder holds ``adapters/<name>/`` PEFT folders and, with a critic, its value heads (rank 0),
and ``optim/<policy>/rank<r>.pt``: every optimizer's state, the agents' policies' and the critics'
(``optimizer_files.py``). The frozen base weights are never written. The driver then lists every file with
its size and SHA-256 in the checkpoint's manifest (``roll_ma/checkpoint.py``), which resume checks before
``load_checkpoint`` runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from roll_ma.training.critic import CriticSet
from roll_ma.training.ds_utils import barrier
from roll_ma.training.optimizer_files import load_optimizer_states, save_optimizer_states
from roll_ma.training.policy_engine import PolicyEngine
from roll_ma.training.policy_weights import FullWeights, LoraWeights


def every_optimizer(updaters: dict[str, PolicyEngine], critic: CriticSet | None) -> dict[str, PolicyEngine]:
    """Every optimizer by name: the agents' policies (``updaters``) and the critics."""
    return {**updaters, **(critic.updaters if critic is not None else {})}


def optimizer_state(optimizers: dict[str, PolicyEngine], policy: str) -> dict[str, Any]:
    """CPU copies of one policy's (or critic's) Adam moments and step counts (for checks and tests)."""
    if policy not in optimizers:
        known = sorted(optimizers)
        raise KeyError(f"{policy!r} has no optimizer (frozen or unknown); policies with one: {known}")
    return optimizers[policy].optimizer_state()


def save_checkpoint(root: Path, weights: LoraWeights | FullWeights, critic: CriticSet | None,
                    optimizers: dict[str, PolicyEngine], rank: int) -> None:
    """The adapters and critic heads (rank 0) and this rank's share of every optimizer's state."""
    if rank == 0:
        weights.save(root)
        if critic is not None:
            critic.save_heads(root)
    save_optimizer_states(optimizers, root, rank)
    barrier()


def load_checkpoint(root: Path, weights: LoraWeights | FullWeights, critic: CriticSet | None,
                    optimizers: dict[str, PolicyEngine], world_size: int) -> None:
    """Restore what ``save_checkpoint`` wrote (same ZeRO stage and number of ranks)."""
    weights.load(root)
    if critic is not None:
        critic.load_heads(root)
    load_optimizer_states(optimizers, root, world_size)
    weights.activate(None)
    barrier()
