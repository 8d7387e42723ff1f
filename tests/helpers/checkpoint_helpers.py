"""Checkpoints written without a run: a finished one, as the pre-flight and the CLI tests read them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from roll_ma import checkpoint as ckpt
from roll_ma.preflight.checkpoint_compat import run_signature


def finished_checkpoint(cfg: Any, step: int, state: dict) -> Path:
    """A complete checkpoint of ``step`` under cfg.trainer.output_dir, signed for ``cfg``."""
    tmp = ckpt.begin_checkpoint(cfg.trainer.output_dir, step)
    (tmp / "trainer").mkdir()
    (tmp / "trainer" / "adapter.bin").write_bytes(b"weights")
    return ckpt.finish_checkpoint(tmp, step, state, keep_last=2, signature=run_signature(cfg))
