"""policy_checkpoint: what a checkpoint of the policy set holds, written and read back (a collaborator of
``policy_set.PolicySet``, which keeps only the calls).

A checkpoint folder holds ``adapters/<name>/`` PEFT folders and, with a critic, its value heads (rank 0),
and ``optim/<policy>/rank<r>.pt``: every optimizer's state, the agents' policies' and the critics'
(``optimizer_files.py``). The frozen base weights are never written. The driver then lists every file with
its size and SHA-256 in the checkpoint's manifest (``roll_ma/checkpoint.py``), which resume checks before
``load_checkpoint`` runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from roll_ma.training.ds_utils import barrier
from roll_ma.training.optimizer_files import load_optimizer_states, save_optimizer_states
from roll_ma.training.policy_engine import PolicyEngine

if TYPE_CHECKING:
    from roll_ma.training.policy_set import PolicySet


def every_optimizer(policies: PolicySet) -> dict[str, PolicyEngine]:
    """Every optimizer of the set by name: the agents' policies and the critics."""
    critics = policies.critic.updaters if policies.critic is not None else {}
    return {**policies.updaters, **critics}


def optimizer_state(policies: PolicySet, policy: str) -> dict[str, Any]:
    """CPU copies of one policy's (or critic's) Adam moments and step counts (for checks and tests)."""
    optimizers = every_optimizer(policies)
    if policy not in optimizers:
        known = sorted(optimizers)
        raise KeyError(f"{policy!r} has no optimizer (frozen or unknown); policies with one: {known}")
    return optimizers[policy].optimizer_state()


def save_checkpoint(policies: PolicySet, root: Path) -> None:
    """The adapters and critic heads (rank 0) and this rank's optimizer states, under ``root``."""
    if policies.rank == 0:
        policies.weights.save(root)
        if policies.critic is not None:
            policies.critic.save_heads(root)
    save_optimizer_states(every_optimizer(policies), root, policies.rank)
    barrier()


def load_checkpoint(policies: PolicySet, root: Path) -> None:
    """Restore what ``save_checkpoint`` wrote (same ZeRO stage and number of ranks)."""
    policies.weights.load(root)
    if policies.critic is not None:
        policies.critic.load_heads(root)
    load_optimizer_states(every_optimizer(policies), root, policies.world_size)
    policies.weights.activate(None)
    barrier()
