"""The memory comparison of ``pipeline_scaling.py``: N agents as adapters on one base against N separate
models, from parameter counts, and on GPU measured in a child process (weights only)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def parameter_counts(model_path: str, rank: int, targets: list[str]) -> tuple[int, int]:
    """(base parameters, LoRA parameters of one adapter): r x (in + out) for every targeted Linear."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    base = sum(p.numel() for p in model.parameters())  # tied embeddings counted once
    lora = sum(
        rank * (m.in_features + m.out_features)
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and name.split(".")[-1] in targets
    )
    return base, lora


def measure_memory_child(args: argparse.Namespace) -> None:
    """GPU bytes (max_memory_allocated) of base + N adapters and of N base copies, for each N."""
    import gc

    import torch
    from common import write_json

    from roll_ma.config.schema import AgentConfig, LoraConfig, ModelConfig
    from roll_ma.models.adapters import inject_adapters, plan_adapters
    from roll_ma.models.loading import load_base_model

    model_cfg = ModelConfig(path=args.model, dtype=args.dtype)

    def peak(load) -> int:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        held = load()
        torch.cuda.synchronize()
        used = torch.cuda.max_memory_allocated() - before
        del held
        return int(used)

    out = {}
    for n in args.memory_agents:
        lora = LoraConfig(rank=args.lora_rank, alpha=2.0 * args.lora_rank)
        _, specs = plan_adapters(lora, [AgentConfig(name=f"agent{i}") for i in range(n)])
        adapters = peak(lambda s=specs: inject_adapters(load_base_model(model_cfg, "cuda"), s, args.seed))
        copies = peak(lambda k=n: [load_base_model(model_cfg, "cuda") for _ in range(k)])
        out[str(n)] = {"adapters_bytes": adapters, "copies_bytes": copies}
    write_json(args.child_out, out)


def memory_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    from common import log, run_child

    from roll_ma.config.schema import ALL_LINEAR

    base, lora = parameter_counts(args.model, args.lora_rank, ALL_LINEAR)
    width = {"float32": 4, "bfloat16": 2, "float16": 2}[args.dtype]
    measured = {}
    if args.device == "cuda":
        agents = ",".join(str(n) for n in args.memory_agents)
        argv = [
            "--device",
            "cuda",
            "--model",
            args.model,
            "--dtype",
            args.dtype,
            "--lora-rank",
            str(args.lora_rank),
        ]
        # --memory-child: without it the child would run main() again and spawn a child of its own
        # --memory-child: the child runs pipeline_scaling.py's main, which measures and returns
        script = str(Path(__file__).resolve().parent / "pipeline_scaling.py")
        measured = run_child(script, [*argv, "--memory-child", "--memory-agents", agents])
        log(f"measured GPU memory: {json.dumps(measured)}")
    rows = []
    for n in args.memory_agents:
        shared, separate = (base + n * lora) * width, n * base * width
        m = measured.get(str(n), {})
        rows.append(
            {
                "agents": n,
                "base_params_M": base / 1e6,
                "lora_params_M_per_agent": lora / 1e6,
                "adapters_on_one_base_GiB": shared / 2**30,
                "separate_models_GiB": separate / 2**30,
                "separate_over_shared": separate / shared,
                "measured_adapters_GiB": m["adapters_bytes"] / 2**30 if m else None,
                "measured_separate_GiB": m["copies_bytes"] / 2**30 if m else None,
            }
        )
    return rows
