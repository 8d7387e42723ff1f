"""Which version of each adapter a vLLM engine serves, under which LoRA id, and how the weights get in.

Every install registers (adapter, version) under a NEW LoRA name and id and retires the old one:
vLLM's prefix cache is keyed by the LoRA name (0.25; name and path in 0.32), so KV computed with
old weights can never be served for the new version. ``lookup`` turns the LoRA id that a request
output reports back into (adapter, version): the version each row really used.

Two ways in (``rollout.adapter_sync``):
- ``memory``: every adapter installed in this call goes to vLLM's worker in ONE ``collective_rpc`` and
  becomes a LoRA model there (``vllm_worker_ext``), no files: a shared-memory segment's name when the
  trainer exported on this node (the worker reads the segment itself), else the packed bytes;
- ``disk``: a PEFT directory per version on /dev/shm, loaded by vLLM's public ``add_lora``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

from roll_ma.distributed.shm_transfer import LORA_PREFIX, SharedTensors, remove_orphans, shm_dir
from roll_ma.distributed.tensor_transfer import PackedTensors, as_tensor_dict, pack_tensors
from roll_ma.models.adapters import AdapterSpec, peft_config_dict, write_adapter_config, write_adapter_dir


def adapter_root() -> str:
    """A private folder for adapter files, on tmpfs (/dev/shm) when there is one: syncs never hit disk.
    Named with this process's pid, so that the next run deletes it should this one be killed."""
    base = shm_dir()
    remove_orphans(base)
    return tempfile.mkdtemp(prefix=f"{LORA_PREFIX}_{os.getpid()}_", dir=str(base))


class EngineAdapters:
    """The adapters one ``vllm.LLM`` serves.

    Args:
        llm: the engine (``enable_lora``; with ``mode="memory"`` also roll_ma's worker extension).
        specs: adapter name -> its spec (rank, alpha, targets).
        mode: "memory" or "disk".
    """

    def __init__(self, llm: Any, specs: dict[str, AdapterSpec], mode: str):
        if mode not in ("memory", "disk"):
            raise ValueError(f"adapter sync mode must be memory or disk, got {mode!r}")
        self.llm, self.specs, self.mode = llm, specs, mode
        self.requests: dict[str, Any] = {}  # adapter name -> its current LoRARequest
        self.versions: dict[str, int] = {}
        self._by_lora_id: dict[int, tuple[str, int]] = {}  # lora_int_id -> (adapter, version)
        self._next_lora_id = 1
        self.root = adapter_root()
        weakref.finalize(self, shutil.rmtree, self.root, True)
        self._peft_configs = {name: peft_config_dict(spec) for name, spec in specs.items()}
        self.last_install: dict[str, float] = {}  # where the last install's time went (benchmarks)

    def request(self, name: str | None) -> Any:
        """The LoRARequest that serves adapter ``name`` now."""
        if name not in self.requests:
            raise RuntimeError(f"adapter {name!r} is not served yet: install it with update_adapters first")
        return self.requests[name]

    def lookup(self, lora_int_id: int) -> tuple[str, int]:
        """(adapter, version) served under a LoRA id."""
        return self._by_lora_id[lora_int_id]

    def install(self, states: dict[str, Any], version: int) -> dict[str, float]:
        """Serve ``states`` (name -> tensors or ``PackedTensors``) as ``version``; the engine's seconds per
        adapter. The caller resets the prefix cache."""
        from vllm.lora.request import LoRARequest

        unknown = sorted(set(states) - set(self.specs))
        if unknown:
            raise ValueError(
                f"update_adapters: unknown adapters {unknown}; this rollout serves {sorted(self.specs)}"
            )
        requests = {}
        for name in states:
            lora_id = self._next_lora_id
            self._next_lora_id += 1
            # memory: one folder per adapter holding only adapter_config.json (vLLM's requests name a path)
            folder = name if self.mode == "memory" else f"{name}.v{version}.{lora_id}"
            requests[name] = LoRARequest(
                f"{name}.v{version}.{lora_id}", lora_id, str(Path(self.root) / folder)
            )
        if self.mode == "memory":
            timings = self._install_in_memory(states, requests)
        else:
            timings = {
                name: self._install_from_dir(name, state, requests[name]) for name, state in states.items()
            }
        for name, request in requests.items():
            old = self.requests.get(name)
            self.requests[name] = request
            self.versions[name] = int(version)
            self._by_lora_id[request.lora_int_id] = (name, int(version))
            if old is not None:
                self._by_lora_id.pop(old.lora_int_id, None)
                if self.mode == "disk":  # the memory install retired the old id inside the worker
                    self.llm.llm_engine.remove_lora(old.lora_int_id)
                    shutil.rmtree(old.lora_path, ignore_errors=True)
        return timings

    def _install_from_dir(self, name: str, state: Any, request: Any) -> float:
        """disk: write a PEFT dir and let vLLM load it (add_lora); ``install`` retires the old version."""
        t0 = time.perf_counter()
        write_adapter_dir(as_tensor_dict(state), self.specs[name], request.lora_path)
        if not self.llm.llm_engine.add_lora(request):
            raise RuntimeError(
                f"vLLM refused adapter {name!r} ({request.lora_name}) from {request.lora_path}"
            )
        return time.perf_counter() - t0

    def _install_in_memory(self, states: dict[str, Any], requests: dict[str, Any]) -> dict[str, float]:
        """memory: every adapter's buffer to vLLM's worker in ONE rpc, built into its LoRA slot there."""
        from roll_ma.inference.vllm_worker_ext import INSTALL_METHOD

        items = []
        for name, state in states.items():
            folder = Path(requests[name].lora_path)
            if not (folder / "adapter_config.json").exists():
                write_adapter_config(self.specs[name], folder)
            old = self.requests.get(name)
            item = {"lora_id": requests[name].lora_int_id, "old_id": old.lora_int_id if old else None,
                    "peft_config": self._peft_configs[name]}
            if isinstance(state, SharedTensors):  # same node: vLLM's worker reads the segment itself
                item.update(segment=state.segment, nbytes=state.nbytes,
                            entries=[list(e) for e in state.entries])
            else:
                packed = state if isinstance(state, PackedTensors) else pack_tensors(state)
                # bytes: vLLM's RPC decodes untyped numpy arrays as (dtype, shape, data) tuples
                item.update(buffer=packed.buffer.tobytes(),
                            entries=[list(e) for e in packed.entries])
            items.append(item)
        start = time.perf_counter()
        per_worker = self.llm.collective_rpc(INSTALL_METHOD, args=(items,))
        self.last_install = {"rpc_s": time.perf_counter() - start}
        # tensor parallel: every worker installs its shard; an adapter is ready when the slowest is done
        return {name: max(w[i] for w in per_worker) for i, name in enumerate(states)}

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
