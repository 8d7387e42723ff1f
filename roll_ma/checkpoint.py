"""Checkpoints written atomically: a half-written checkpoint is never taken as the latest.

Layout: ``<output_dir>/checkpoints/step_000012/`` holding ``trainer/`` (every agent's PEFT
adapter, optimizer and scheduler states, written by the train workers), ``state.json``
(step, data cursor, adapter versions), ``rng.pt`` (driver RNG states), ``run_signature.json`` (what
of the config the tensors depend on, compared on resume before Ray starts), ``manifest.json``
(every other file with its size and SHA-256, see ``checkpoint_manifest``) and last a
``COMPLETE`` marker (the step and the manifest's SHA-256). Every file gets the same
permissions. Everything is written into a temporary sibling directory first and renamed into
place after the marker, so a crash at any moment leaves either the previous complete
checkpoint or the new one.

Each checkpoint written and each unfinished one removed (the temporary of a write that was cut short,
removed when the run resumes) is one line through the caller's ``log`` (the pipelines': the console and
``logs/run.log``).

Resume checks the newest complete checkpoint against its manifest (``choose_resume``: the one
choice the RL loop, the phases and the pre-flight check share) and, if a file is missing,
truncated or changed, moves it aside (``resume_checkpoint``) to ``damaged_step_NNNNNN`` (saying
which file and why) and takes the newest intact one instead; with none intact it stops with
an error naming the directory and the fix.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from roll_ma.checkpoint_manifest import (
    MARKER,
    Verdict,
    check_checkpoint,
    same_permissions,
    write_manifest,
    write_marker,
)
from roll_ma.errors import RunStartError

_STEP_DIR = re.compile(r"^step_(\d+)$")
_TMP_DIR = re.compile(r"^\.tmp_step_(\d+)_")  # begin_checkpoint's temporaries
SIGNATURE_FILE = "run_signature.json"  # the config's record: roll_ma/preflight/checkpoint_compat.py


def checkpoints_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def complete_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first."""
    root = checkpoints_dir(output_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / MARKER).exists():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(output_dir: str | Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint, unchecked: never what a run resumes from (``choose_resume``)."""
    done = complete_checkpoints(output_dir)
    return done[-1] if done else None


@dataclass(frozen=True)
class ResumeChoice:
    """What ``trainer.resume=auto`` would continue from, found without changing anything on disk."""

    chosen: tuple[int, Path] | None  # (step, path) of the newest complete checkpoint matching its manifest
    damaged: list[tuple[Path, str]]  # newer complete checkpoints that do not match, with the reason
    note: str = ""  # about the chosen one (e.g. written before manifests existed: loaded unchecked)

    def no_intact_message(self, output_dir: str | Path) -> str | None:
        """The error when checkpoints exist but none is intact (None otherwise)."""
        if self.chosen is not None or not self.damaged:
            return None
        details = "\n".join(f"  - {p.name}: {reason}" for p, reason in self.damaged)
        return (
            f"no intact checkpoint to resume from in {checkpoints_dir(output_dir)}:\n{details}\n"
            "Start this run from scratch with trainer.resume=never (moves these checkpoints aside), "
            "or give it another trainer.output_dir."
        )


def choose_resume(output_dir: str | Path) -> ResumeChoice:
    """The one choice of checkpoint every resume makes (RL loop, phases, the pre-flight check): the newest
    complete checkpoint whose files match its manifest. Reads only; ``resume_checkpoint`` acts on it."""
    damaged: list[tuple[Path, str]] = []
    for step, path in reversed(complete_checkpoints(output_dir)):
        verdict = _verdict(path)
        if verdict.ok:
            return ResumeChoice((step, path), damaged, verdict.reason)
        damaged.append((path, verdict.reason))
    return ResumeChoice(None, damaged)


def resume_checkpoint(
    output_dir: str | Path, log: Callable[[str], None] = print
) -> tuple[int, Path] | None:
    """(step, path) of the newest complete checkpoint that matches its manifest; None if there is none.

    Damaged newer ones are reported through ``log`` and moved aside to ``damaged_step_NNNNNN``
    (kept for inspection, never pruned, never resumed from). Raises ``RunStartError`` naming the
    directory and the fix when checkpoints exist but none is intact (nothing is moved then).
    """
    choice = choose_resume(output_dir)
    message = choice.no_intact_message(output_dir)
    if message:
        raise RunStartError(message)
    if choice.chosen is None:
        return None
    for bad, reason in choice.damaged:
        aside = _set_aside(bad)
        log(f"[roll_ma] skipped the damaged checkpoint {bad.name}: {reason}; moved it to {aside}")
    if choice.note:
        log(f"[roll_ma] note: checkpoint {choice.chosen[1].name}: {choice.note}")
    return choice.chosen


_VERDICTS: dict[tuple, Verdict] = {}  # the driver's memo: the pre-flight check and the resume read once


def _verdict(path: Path) -> Verdict:
    """``check_checkpoint``, remembered while no file of the checkpoint changes size or mtime (a resume
    re-reads what the pre-flight check read a moment before: every byte of a large checkpoint, twice)."""
    try:
        stats = [(p, p.stat()) for p in path.rglob("*") if p.is_file()]
    except OSError:  # a file went away while listing: check it for real
        return check_checkpoint(path)
    key = (str(path), tuple(sorted((str(p), st.st_size, st.st_mtime_ns) for p, st in stats)))
    if key not in _VERDICTS:
        _VERDICTS[key] = check_checkpoint(path)
    return _VERDICTS[key]


def _set_aside(path: Path) -> Path:
    dest = path.with_name(f"damaged_{path.name}")
    n = 1
    while dest.exists():
        n += 1
        dest = path.with_name(f"damaged_{path.name}.{n}")
    os.rename(path, dest)
    return dest


def begin_checkpoint(output_dir: str | Path, step: int) -> Path:
    """A fresh temporary directory to write the checkpoint of ``step`` into."""
    root = checkpoints_dir(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp_step_{step:06d}_{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def _fsync_tree(path: Path) -> None:
    for p in sorted(path.rglob("*"), reverse=True):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def finish_checkpoint(
    tmp: Path,
    step: int,
    state: dict[str, Any],
    keep_last: int,
    signature: dict[str, Any] | None = None,
    log: Callable[[str], None] = print,
) -> Path:
    """Write the driver state, the run's signature (what resume compares with the config), manifest and
    marker, then rename into place, say so through ``log`` (one line) and prune old checkpoints."""
    (tmp / "state.json").write_text(json.dumps({"step": step, **state}, indent=2, default=str))
    if signature is not None:
        (tmp / SIGNATURE_FILE).write_text(json.dumps(signature, indent=1, sort_keys=True))
    torch.save(rng_state(), tmp / "rng.pt")
    same_permissions(tmp)
    write_marker(tmp, step, write_manifest(tmp, step))
    _fsync_tree(tmp)
    final = tmp.parent / f"step_{step:06d}"
    if final.exists():  # a re-run of the same step after resume replaces the old copy
        shutil.rmtree(final)
    os.rename(tmp, final)  # atomic on POSIX: readers see the old set or the new one
    log(f"[roll_ma] checkpoint written: {final} (step {step})")
    prune(tmp.parent.parent, keep_last, log)
    return final


def prune(output_dir: str | Path, keep_last: int, log: Callable[[str], None] = print) -> None:
    """Keep the newest ``keep_last`` complete checkpoints; remove temporaries of crashed writes (each one
    said through ``log``: the run had a checkpoint under way that it will now write again)."""
    done = complete_checkpoints(output_dir)
    for _, path in done[: max(0, len(done) - keep_last)]:
        shutil.rmtree(path, ignore_errors=True)
    for p in sorted(checkpoints_dir(output_dir).glob(".tmp_step_*")):
        shutil.rmtree(p, ignore_errors=True)
        m = _TMP_DIR.match(p.name)
        of_step = f" of step {int(m.group(1))}" if m else ""
        log(f"[roll_ma] removed the unfinished checkpoint{of_step} (its write was cut short): {p}")


def load_state(path: str | Path) -> dict[str, Any]:
    state = json.loads((Path(path) / "state.json").read_text())
    rng = Path(path) / "rng.pt"
    if rng.exists():
        set_rng_state(torch.load(rng, weights_only=False))
    return state


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
