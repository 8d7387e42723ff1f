"""DeepSpeed plumbing shared by the train strategies: process setup, engine config, collectives.

Everything that touches ``deepspeed`` at import time lives here, so the rest of the
strategies read like plain PyTorch. ``setup_deepspeed`` is the one place that knows the
CPU quirks measured in STACK.md (gloo, the shared-memory op, thread counts).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import torch

from roll_ma.config.schema import TrainConfig
from roll_ma.distributed.resources import usable_cpus

# DeepSpeed needs a train_batch_size triple; roll_ma feeds micro-batches itself, so these are placeholders.
_PLACEHOLDER_MICRO_BATCH = 1
_NEVER_PRINT = 10**12


def training_device() -> torch.device:
    """cuda:0 when a GPU is visible (each actor sees only its own), else the CPU.

    ``DS_ACCELERATOR=cpu`` forces the CPU even with a GPU present: DeepSpeed then moves the
    model to its accelerator (the CPU), and the inputs must follow it.
    """
    if torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR", "cuda") != "cpu":
        return torch.device("cuda:0")
    return torch.device("cpu")


def cpu_threads_per_rank(world_size: int) -> int:
    """Torch threads for one of ``world_size`` ranks sharing the cores this process may use."""
    return max(1, usable_cpus() // max(1, world_size))


SHARERS_VAR = "ROLL_MA_CPU_SHARERS"  # set per role by the pipeline (pipelines/clusters.py: cpu_sharers)


def use_cpu_threads(world_size: int) -> int:
    """On CPU: this worker's torch threads, and OpenMP's / MKL's for libraries that start later, are its
    share of the cores this process may use: split among the run's workers that compute at the same time
    (``ROLL_MA_CPU_SHARERS``, set by the pipeline; else the ``world_size`` ranks of the role). Returns it."""
    sharers = int(os.environ.get(SHARERS_VAR) or world_size)
    threads = cpu_threads_per_rank(sharers)
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(threads)
    return threads


def _ensure_dist_env(rank: int, world_size: int) -> None:
    """Fill the torch.distributed variables DeepSpeed reads (without all five it tries MPI discovery)."""
    from roll_ma.distributed.worker import free_port

    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world_size))
    os.environ.setdefault("LOCAL_RANK", "0")
    if "MASTER_ADDR" not in os.environ or "MASTER_PORT" not in os.environ:
        if world_size > 1:
            raise RuntimeError(
                f"rank {rank} of {world_size}: MASTER_ADDR / MASTER_PORT are not set; start data-parallel "
                "train workers through roll_ma.distributed.cluster.Cluster, which sets them")
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
    if int(os.environ["WORLD_SIZE"]) != world_size or int(os.environ["RANK"]) != rank:
        env_rank, env_world = os.environ["RANK"], os.environ["WORLD_SIZE"]
        raise RuntimeError(f"this process is RANK={env_rank} of WORLD_SIZE={env_world} but the strategy was "
                           f"built for rank {rank} of {world_size}")


def setup_deepspeed(rank: int, world_size: int) -> Any:
    """Import DeepSpeed ready for this process and join the data-parallel group; returns the module.

    On CPU: ``DS_ACCELERATOR=cpu`` (read when DeepSpeed first picks an accelerator) and no
    shared-memory comm op. DeepSpeed's CPU backend JIT-compiles that op with g++ on its first
    ``init_distributed`` (45-63 s on 2 cores, STACK.md), yet ZeRO never uses it: its
    collectives go through torch.distributed (gloo). Replacing the builder with a no-op makes
    the backend fall back to plain torch.distributed, and nothing is compiled.
    """
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    _ensure_dist_env(rank, world_size)
    import deepspeed

    comm_torch: Any = sys.modules["deepspeed.comm.torch"]  # a module attribute mypy does not know
    comm_torch.build_shm_op = lambda: None
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    deepspeed.utils.logger.setLevel(logging.WARNING)
    deepspeed.init_distributed(verbose=False)  # a no-op when this process already joined the group
    return deepspeed


def deepspeed_config(train_cfg: TrainConfig, lr: float, bf16: bool,
                     zero_stage: int | None = None, trainable_elements: int | None = None) -> dict[str, Any]:
    """The engine config of one policy's optimizer.

    ``gradient_accumulation_steps`` is 1 because roll_ma drives the accumulation boundary
    itself (a mini-batch has a variable number of micro-batches); ``torch_adam`` selects
    torch.optim.AdamW instead of DeepSpeed's FusedAdam, which would JIT-compile (+70 s on CPU).
    """
    stage = train_cfg.zero_stage if zero_stage is None else zero_stage  # 0..2: the schema's limit
    betas = list(train_cfg.betas)
    if len(betas) != 2:
        raise ValueError(f"train.betas must be two numbers, got {betas}")
    return {
        "train_micro_batch_size_per_gpu": _PLACEHOLDER_MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        # ZeRO-0: PolicyEngine clips with the norm it computes anyway (DeepSpeed's clip_grad_norm_ walks
        # every parameter of the shared model, once per agent per step); ZeRO-1/2 clip their own shards
        "gradient_clipping": float(train_cfg.grad_clip) if stage > 0 else 0.0,
        "optimizer": {"type": "AdamW", "params": {
            "lr": lr, "betas": betas, "eps": train_cfg.eps, "weight_decay": train_cfg.weight_decay,
            "torch_adam": True}},
        "zero_optimization": _zero_section(stage, trainable_elements),
        "bf16": {"enabled": bool(bf16)},
        "steps_per_print": _NEVER_PRINT,
        "wall_clock_breakdown": False,
    }


def _zero_section(stage: int, trainable_elements: int | None) -> dict[str, Any]:
    """ZeRO settings; communication buckets sized to the policy, not DeepSpeed's 5e8-element default.

    Every adapter has its own engine, and ZeRO-1/2 allocate their buckets per engine: at the
    default size that is GBs of GPU memory per agent for a few MB of LoRA weights, memory a
    colocated vLLM engine needs back when it wakes up.
    """
    section: dict[str, Any] = {"stage": stage}
    if stage > 0 and trainable_elements:
        bucket = int(min(5e8, max(1e6, trainable_elements)))
        section.update(reduce_bucket_size=bucket, allgather_bucket_size=bucket)
    return section


def dist_world_size() -> int:
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def all_reduce_sum(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Sum ``t`` over the data-parallel ranks (a copy; on ``device`` for the collective, returned on CPU)."""
    if dist_world_size() == 1:
        return t.clone()
    buf = t.to(device=device, dtype=torch.float64).contiguous()
    torch.distributed.all_reduce(buf)
    return buf.to("cpu", torch.float64)


def all_reduce_max(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Elementwise max of ``t`` over the data-parallel ranks (a copy, returned on CPU)."""
    if dist_world_size() == 1:
        return t.clone()
    buf = t.to(device=device, dtype=torch.float64).contiguous()
    torch.distributed.all_reduce(buf, op=torch.distributed.ReduceOp.MAX)
    return buf.to("cpu", torch.float64)


def barrier() -> None:
    if dist_world_size() > 1:
        torch.distributed.barrier()
