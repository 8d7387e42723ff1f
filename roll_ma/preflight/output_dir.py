"""The run's output folder, checked before Ray starts: can it be made and written, and is there anything left
to do in it.

``output_dir_problems``: ``trainer.output_dir`` is a folder this process can create and write (not a file,
not under a file, not read-only), and the files a run writes there (``checkpoints/``, ``logs/``,
``metrics.jsonl``) are of the right kind. Checked by writing and removing one small file where the folder
is or would be created: permission bits say nothing for root, and nothing of a read-only file system.

``finished_run``: a run that resumes (``trainer.resume=auto``) from a checkpoint that already holds every
step (or every phase) says so in one line instead of starting Ray to train nothing.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roll_ma.config.run_plan import rl_loop
from roll_ma.config.schema import RunConfig

KEY = "trainer.output_dir"
FIX = f"give {KEY} a folder this user can write to"
RUN_FILES = {"checkpoints": "folder", "logs": "folder", "metrics.jsonl": "file"}  # what a run writes there


def output_dir_problems(output_dir: str) -> list[str]:
    """What keeps a run from writing ``output_dir`` (one problem at most: the first cause)."""
    path = Path(output_dir).expanduser()
    if path.is_symlink() and not path.exists():
        return [f"{KEY}: {path} is a link to {os.readlink(path)}, which does not exist; {FIX}"]
    if path.exists() and not path.is_dir():
        return [f"{KEY}: {path} is a file, not a folder; {FIX} (it is created when missing)"]
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return [f"{KEY}: {path} cannot be created: {existing} is a file, not a folder; {FIX}"]
    why = cannot_write(existing)
    if why:
        if existing == path:
            return [f"{KEY}: {path} cannot be written ({why}); {FIX}"]
        return [f"{KEY}: {path} cannot be created: {existing} cannot be written ({why}); {FIX}"]
    for name, kind in RUN_FILES.items():
        item = path / name
        if item.exists() and (item.is_dir() != (kind == "folder")):
            return [f"{KEY}: {item} must be a {kind}, the run writes its {name} there; move it away or {FIX}"]
        if item.is_dir() and (why := cannot_write(item)):
            return [f"{KEY}: {item} cannot be written ({why}); {FIX}"]
        if item.is_file() and not os.access(item, os.W_OK):
            return [f"{KEY}: {item} cannot be written (permission denied); {FIX}"]
    return []


def cannot_write(folder: Path) -> str | None:
    """Why a file cannot be made in ``folder`` (None: it can); the folder is left as it was."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".roll_ma_write_check_")
    except OSError as err:
        return (err.strerror or str(err)).lower()
    os.close(fd)
    os.unlink(name)
    return None


@dataclass(frozen=True)
class FinishedRun:
    """A run with nothing left to do: the line that says so, and what ``roll_ma.train`` returns."""

    line: str
    result: dict[str, Any]


def finished_run(cfg: RunConfig) -> FinishedRun | None:
    """The run's checkpoint already holds all of it (None: there is work to do, or nothing to resume)."""
    from roll_ma.checkpoint import choose_resume

    if cfg.trainer.resume != "auto":
        return None
    chosen = choose_resume(cfg.trainer.output_dir).chosen
    if chosen is None:
        return None
    step, path = chosen
    out = Path(cfg.trainer.output_dir)
    if not rl_loop(cfg):
        return _phases_done(cfg, step, path, out)
    if step < cfg.trainer.max_steps:
        return None
    if step == cfg.trainer.max_steps:
        line = f"step {step} of {step} already done in {out}; raise trainer.max_steps to continue"
    else:
        line = (
            f"step {step} already done in {out}, past trainer.max_steps={cfg.trainer.max_steps}; raise "
            f"trainer.max_steps above {step} to continue"
        )
    return FinishedRun(f"[roll_ma] {line}", _last_metrics(out, step))


def _phases_done(cfg: RunConfig, step: int, path: Path, out: Path) -> FinishedRun | None:
    import json

    from roll_ma.config.phase_plan import plan_phases

    phases = plan_phases(cfg)
    try:
        state = json.loads((path / "state.json").read_text())
    except (OSError, ValueError):
        return None  # the resume reads it and reports what is wrong
    if state.get("phase", 0) < len(phases):
        return None
    names = ", ".join(p.name for p in phases)
    line = (
        f"[roll_ma] every phase ({names}) already done in {out} (step {step}); add a phase to continue, "
        "or start again with trainer.resume=never"
    )
    return FinishedRun(line, dict(state.get("results") or {}))


def _last_metrics(out: Path, step: int) -> dict[str, Any]:
    """The metrics of ``step`` from ``metrics.jsonl`` (what the run returned when it ended)."""
    from roll_ma.tracking import read_metrics

    try:
        rows = [r for r in read_metrics(out / "metrics.jsonl") if r.get("step") == step]
    except (OSError, ValueError):
        return {}
    merged: dict[str, Any] = {}
    for row in rows:
        merged.update(row)
    return merged
