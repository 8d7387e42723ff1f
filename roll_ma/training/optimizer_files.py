"""optimizer_files: each policy's (and critic's) optimizer state in a checkpoint, ``optim/<name>/rank<r>.pt``.

At ZeRO-0 the optimizer state is replicated and only rank 0 writes it; at ZeRO 1/2 every rank writes its
own shard, and a resume needs the same stage and number of ranks.
"""

from __future__ import annotations

from pathlib import Path

import torch

from roll_ma.training.policy_engine import PolicyEngine


def save_optimizer_states(updaters: dict[str, PolicyEngine], root: Path, rank: int) -> None:
    """Write this rank's share of every engine's optimizer state under ``root / "optim"``."""
    for name, updater in updaters.items():
        if updater.zero_stage > 0 or rank == 0:
            path = root / "optim" / name / f"rank{rank}.pt"
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(updater.state_dict(), path)


def load_optimizer_states(updaters: dict[str, PolicyEngine], root: Path, world_size: int) -> None:
    """Restore what ``save_optimizer_states`` wrote; a missing file fails naming every one missing."""
    for name, updater in updaters.items():
        ranks = range(world_size) if updater.zero_stage > 0 else [0]
        files = [root / "optim" / name / f"rank{r}.pt" for r in ranks]
        missing = [str(f) for f in files if not f.exists()]
        if missing:
            raise FileNotFoundError(f"checkpoint {root} lacks optimizer states {missing}")
        updater.load_state_dict([torch.load(f, map_location="cpu", weights_only=False) for f in files])
