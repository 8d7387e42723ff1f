"""Packed tensors handed over in a POSIX shared-memory segment, between processes of one node.

The adapter sync's fast path when the train worker and the rollout engines share a node (always
when colocated): the train worker copies each packed adapter from the GPU straight into a segment
in /dev/shm (RAM, not disk) and sends only its name through Ray; vLLM's worker process reads the
segment while it builds the LoRA. Nothing is pickled, stored in Ray's object store or pushed
through vLLM's RPC socket. Across nodes the sync uses Ray's object store (``PackedTensors``).

Lifetime: the process that creates a segment owns it (``SegmentOwner``) and unlinks it once the
driver says the install is done, or at the next export, or when it shuts down. Readers only attach.
"""

from __future__ import annotations

import sys
import uuid
from dataclasses import dataclass
from multiprocessing import shared_memory

import numpy as np
import torch

Entry = tuple[str, str, tuple[int, ...], int, int]  # name, dtype, shape, byte offset, byte count


@dataclass
class SharedTensors:
    """Named tensors in one shared-memory segment (the ``PackedTensors`` layout) on node ``node_id``."""

    segment: str
    nbytes: int
    entries: list[Entry]
    node_id: str


def _attach(name: str) -> shared_memory.SharedMemory:
    """Attach without letting this process's resource tracker unlink the segment at exit (before Python
    3.13 an attaching process registers the segment as if it had created it)."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    seg = shared_memory.SharedMemory(name=name)
    try:
        from multiprocessing import resource_tracker

        resource_tracker.unregister(seg._name, "shared_memory")  # type: ignore[attr-defined]
    except Exception:  # tracker internals vary; at worst the segment is unlinked at this process's exit
        pass
    return seg


def read_shared(shared: SharedTensors) -> dict[str, torch.Tensor]:
    """CPU tensors copied out of the segment (each in its own storage; the segment may go right after)."""
    seg = _attach(shared.segment)
    try:
        raw = np.ndarray((shared.nbytes,), dtype=np.uint8, buffer=seg.buf)
        out = {}
        for name, dtype, shape, offset, nbytes in shared.entries:
            part = torch.from_numpy(raw[offset : offset + nbytes].copy())
            out[name] = part.view(getattr(torch, dtype)).reshape(tuple(shape))
        del raw
        return out
    finally:
        seg.close()


class SegmentOwner:
    """Creates segments for packed tensors and unlinks them when told to (or when closed)."""

    def __init__(self, node_id: str, prefix: str = "roll_ma"):
        self.node_id = node_id
        self.prefix = f"{prefix}_{uuid.uuid4().hex[:8]}"
        self._live: list[shared_memory.SharedMemory] = []

    def put(self, buffer: torch.Tensor, entries: list[Entry]) -> SharedTensors:
        """Copy a (nbytes,) uint8 buffer (any device) into a new segment: one device-to-host copy."""
        nbytes = int(buffer.numel())
        seg = shared_memory.SharedMemory(create=True, size=max(nbytes, 1),
                                         name=f"{self.prefix}_{len(self._live)}_{uuid.uuid4().hex[:6]}")
        self._live.append(seg)
        if nbytes:
            torch.frombuffer(seg.buf, dtype=torch.uint8, count=nbytes).copy_(buffer.reshape(-1))
        return SharedTensors(seg.name, nbytes, list(entries), self.node_id)

    def release(self) -> int:
        """Unlink every segment made so far; returns how many."""
        count = len(self._live)
        for seg in self._live:
            seg.close()
            try:
                seg.unlink()
            except FileNotFoundError:
                pass
        self._live = []
        return count
