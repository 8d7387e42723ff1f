"""What a checkpoint holds, written down before it is marked complete, and checked before resuming.

``manifest.json`` lists every file of the checkpoint (path relative to the checkpoint
directory, size in bytes, SHA-256; the same digest ``sha256sum`` prints), except itself and
the ``COMPLETE`` marker. The marker holds the step and the manifest's own SHA-256, so a
damaged manifest is caught too. ``check_checkpoint`` re-reads every file and says what does
not match; resume uses it to skip a damaged checkpoint (``roll_ma.checkpoint.resume_checkpoint``).

Checkpoints written before manifests existed have a marker holding only the step: they are
reported as unverified and still loaded, so a run started with an older roll_ma can resume.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

MARKER = "COMPLETE"
MANIFEST = "manifest.json"
_CHUNK = 8 * 1024 * 1024


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _files(ckpt_dir: Path) -> list[Path]:
    skip = {MANIFEST, MARKER}
    files = (p for p in ckpt_dir.rglob("*") if p.is_file())
    return sorted(p for p in files if p.relative_to(ckpt_dir).as_posix() not in skip)


def write_manifest(ckpt_dir: str | Path, step: int) -> str:
    """Write ``manifest.json`` for every file now in ``ckpt_dir``; returns the manifest's SHA-256."""
    root = Path(ckpt_dir)
    files = {
        p.relative_to(root).as_posix(): {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in _files(root)
    }
    (root / MANIFEST).write_text(json.dumps({"step": step, "files": files}, indent=1, sort_keys=True))
    return sha256_file(root / MANIFEST)


def write_marker(ckpt_dir: str | Path, step: int, manifest_sha256: str) -> None:
    (Path(ckpt_dir) / MARKER).write_text(json.dumps({"step": step, "manifest_sha256": manifest_sha256}))


@dataclass(frozen=True)
class Verdict:
    """The result of checking one checkpoint: usable or not, and in words why."""

    ok: bool
    reason: str = ""  # why it is damaged, or a note on an unverified (pre-manifest) checkpoint


def check_checkpoint(ckpt_dir: str | Path) -> Verdict:
    """Re-read every file the manifest lists and compare size and SHA-256 (missing files included)."""
    root = Path(ckpt_dir)
    try:
        marker = json.loads((root / MARKER).read_text())
    except (OSError, ValueError) as err:
        return Verdict(False, f"its {MARKER} marker cannot be read ({err})")
    if isinstance(marker, int):  # an older roll_ma wrote the step alone and no manifest
        return Verdict(True, "it has no manifest (written by an older roll_ma), so it is loaded unchecked")
    if not isinstance(marker, dict) or "manifest_sha256" not in marker:
        return Verdict(False, f"its {MARKER} marker is not one roll_ma writes")
    manifest = root / MANIFEST
    if not manifest.is_file():
        return Verdict(False, f"{MANIFEST} is missing")
    if sha256_file(manifest) != marker["manifest_sha256"]:
        return Verdict(False, f"{MANIFEST} does not match the checksum in {MARKER}")
    problems = []
    for rel, want in json.loads(manifest.read_text())["files"].items():
        path = root / rel
        if not path.is_file():
            problems.append(f"{rel} is missing")
        elif path.stat().st_size != want["size"]:
            problems.append(f"{rel} is {path.stat().st_size:,} bytes, the manifest says {want['size']:,}")
        elif sha256_file(path) != want["sha256"]:
            problems.append(f"{rel} does not match its SHA-256 in the manifest")
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        return Verdict(False, "; ".join(problems[:3]) + more)
    return Verdict(True)


def new_file_mode() -> int:
    """The mode a file created now gets (0o666 less the umask), e.g. 0o644."""
    # why: os.umask can only be read by setting it; set it back at once (the driver is single-threaded here)
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def same_permissions(root: str | Path) -> None:
    """Give every file under ``root`` the mode of a newly created file.

    Writers disagree: safetensors writes 0600 (through a private temp file), torch.save and
    plain writes 0644 under the usual umask; a checkpoint others can read in part is a trap.
    """
    mode = new_file_mode()
    for p in Path(root).rglob("*"):
        if p.is_file() and not p.is_symlink() and stat.S_IMODE(p.stat().st_mode) != mode:
            try:
                os.chmod(p, mode)
            except PermissionError:  # written by another user (shared storage): leave it as it is
                pass
