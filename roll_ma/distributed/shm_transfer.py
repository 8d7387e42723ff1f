"""Packed tensors handed over in shared memory, between processes of one node.

The adapter sync's fast path when the train worker and the rollout engines share a node (always
when colocated): the train worker copies each packed adapter from the GPU straight into a file in
/dev/shm (RAM, not disk; the temp dir where there is no /dev/shm) and sends only its path through
Ray; vLLM's worker process reads the file while it builds the LoRA. Nothing is pickled, stored in
Ray's object store or pushed through vLLM's RPC socket. Across nodes the sync uses Ray's object
store (``PackedTensors``).

Plain files, not ``multiprocessing.shared_memory``: vLLM's worker is a child of the rollout worker
and shares its multiprocessing resource tracker, which would unlink, or complain about, segments
that another process owns.

Lifetime: the process that writes a file owns it (``SegmentOwner``) and deletes it once the driver
says the install is done, at the next export, or when it is closed; a new owner also deletes the
files of owners whose process is gone (a killed run leaves nothing behind for long).

Every roll_ma entry in /dev/shm carries its owner's pid (``roll_ma_sync_<pid>_...`` files,
``roll_ma_lora_<pid>_...`` adapter folders of vLLM engines): ``remove_orphans`` deletes those of
processes that are gone, at the start of every run and of every owner.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

Entry = tuple[str, str, tuple[int, ...], int, int]  # name, dtype, shape, byte offset, byte count
PREFIX = "roll_ma_sync"
LORA_PREFIX = "roll_ma_lora"  # vLLM engines' adapter folders (inference/vllm_adapters.py)


@dataclass
class SharedTensors:
    """Named tensors in one shared-memory file (the ``PackedTensors`` layout) on node ``node_id``."""

    segment: str  # the file's path
    nbytes: int
    entries: list[Entry]
    node_id: str


def shm_dir() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


def read_shared(shared: SharedTensors) -> dict[str, torch.Tensor]:
    """CPU tensors read out of the file, each in its own storage (the file may go right after)."""
    raw = np.fromfile(shared.segment, dtype=np.uint8, count=shared.nbytes)  # (nbytes,) one copy
    if raw.size != shared.nbytes:
        raise RuntimeError(f"{shared.segment} holds {raw.size} bytes, the sender wrote {shared.nbytes}")
    out = {}
    for name, dtype, shape, offset, nbytes in shared.entries:
        part = torch.from_numpy(raw[offset : offset + nbytes].copy())  # aligned storage of its own
        out[name] = part.view(getattr(torch, dtype)).reshape(tuple(shape))
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class SegmentOwner:
    """Writes packed tensors to shared-memory files and deletes them when told to (or when closed)."""

    def __init__(self, node_id: str):
        self.node_id = node_id
        self.root = shm_dir()
        self.prefix = f"{PREFIX}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        self._live: list[Path] = []
        self._remove_orphans()

    def put(self, buffer: torch.Tensor, entries: list[Entry]) -> SharedTensors:
        """Copy a (nbytes,) uint8 buffer (any device) into a new file: one device-to-host copy."""
        nbytes = int(buffer.numel())
        path = self.root / f"{self.prefix}_{len(self._live)}_{uuid.uuid4().hex[:6]}"
        self._live.append(path)
        with open(path, "wb") as f:
            f.truncate(nbytes)
        if nbytes:
            mapped = np.memmap(path, dtype=np.uint8, mode="r+", shape=(nbytes,))
            torch.from_numpy(mapped).copy_(buffer.reshape(-1))
            mapped.flush()
            del mapped
        return SharedTensors(str(path), nbytes, list(entries), self.node_id)

    def release(self, segments: list[str] | None = None) -> int:
        """Delete the named files (None: every file written so far); returns how many."""
        gone = self._live if segments is None else [p for p in self._live if str(p) in set(segments)]
        for path in gone:
            path.unlink(missing_ok=True)
        self._live = [p for p in self._live if p not in gone]
        return len(gone)

    def _remove_orphans(self) -> None:
        remove_orphans(self.root)


def remove_orphans(root: Path | None = None) -> int:
    """Delete the roll_ma entries (``<prefix>_<pid>_...``) of processes that are gone: what a killed run
    left (kill -9 gives no process a chance to clean up). Returns how many were removed."""
    root = root or shm_dir()
    removed = 0
    for prefix in (PREFIX, LORA_PREFIX):
        for path in root.glob(f"{prefix}_*"):
            pid = path.name[len(prefix) + 1 :].split("_")[0]
            if not pid.isdigit() or _alive(int(pid)):  # no pid: not ours to judge (an older roll_ma)
                continue
            try:
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
                removed += 1
            except FileNotFoundError:  # another process swept it first
                pass
            except OSError:  # another user's: theirs to sweep
                pass
    return removed
