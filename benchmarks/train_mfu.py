"""Model FLOPs utilisation of the train worker's passes: reference log-probs, old log-probs, the update.

    python benchmarks/train_mfu.py                                        # CPU, tiny model (TFLOP/s only)
    python benchmarks/train_mfu.py --device cuda --model /path/to/random-7b --rows 16 \
        --prompt-lens 100,2048,2048 --response-len 512 --variants padded,packed,packed_nockpt_8k \
        --profile packed --out mfu.json
    # the peers job's update (job.yaml: 192 rows in groups of 8, ~136-token prompts, 256-token replies)
    python benchmarks/train_mfu.py --device cuda --model /path/to/random-7b --agents 1 --rows 192 \
        --group-size 8 --prompt-lens 136 --response-len 256 --variants packed_nockpt_8k,shared_nockpt_8k \
        --profile shared_nockpt_8k

One multi-agent strategy (the shipped 7B config's train settings: ZeRO-0, bf16, LoRA r16 on q,k,v,o,
gradient checkpointing, 16k-token micro-batches, 32k for scoring, chunked LM head) on one batch shaped
like a ``math_selfplay_7b`` step (agent k's prompts ~``prompt-lens[k]`` tokens, left-padded with
+-25% jitter; responses ``--response-len``, or spread down to a quarter with ``--spread``). Each
variant changes only how rows run (padding, checkpointing, budgets, a group's prompt once: rows of one
``--group-size`` group share their prompt's tokens) and is timed after a warm-up:
seconds, MFU by the formula in ``roll_ma/models/flops.py`` (docs/benchmarks.md), peak memory.
``--profile VARIANT`` adds a torch profiler table of one scoring pass and one update of it (top
kernels by GPU time, and how much of the wall clock no kernel ran). It never asserts.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from common import (
    base_parser,
    cuda_sync,
    environment,
    log,
    prepare_model,
    report,
    setup_device,
    str_list,
    warm_median_s,
)

# variant -> (remove_padding, gradient checkpointing, train token budget, scoring token budget, a group's
# prompt run once: train.share_prompt_prefix, which needs packed rows and --group-size > 1 to matter)
VARIANTS = {
    "padded": (False, True, 16384, 32768, False),  # the shipped math_selfplay_7b before packing
    "packed": (True, True, 16384, 32768, False),
    "packed_big": (True, True, 32768, 65536, False),
    "packed_nockpt_8k": (True, False, 8192, 32768, False),
    "packed_nockpt_16k": (True, False, 16384, 32768, False),
    "padded_nockpt_8k": (False, False, 8192, 32768, False),
    # the peers job's roll_ma row (benchmarks/peers/job.yaml): packed, no checkpointing, 8k, prompt once
    "shared_nockpt_8k": (True, False, 8192, 32768, True),
}


def parse_args(argv: list[str] | None = None) -> Any:
    p = base_parser(__doc__)
    p.add_argument("--agents", type=int, default=3)
    p.add_argument("--rows", type=int, default=16, help="rows per agent")
    p.add_argument("--prompt-lens", default="100,2048,2048", help="each agent's mean prompt tokens")
    p.add_argument("--response-len", type=int, default=512)
    p.add_argument("--spread", action="store_true", help="responses from a quarter to all of --response-len")
    p.add_argument("--group-size", type=int, default=1,
                   help="rows per GRPO group: an agent's rows come in groups of this many with one prompt "
                        "(the last group smaller where --rows is not a multiple)")
    p.add_argument("--variants", default="padded,packed", help=f"of {sorted(VARIANTS)}")
    p.add_argument("--profile", default=None, help="a variant to profile with torch.profiler")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--trace", default=None, help="write the profiled update's chrome trace here")
    args = p.parse_args(argv)
    args.prompt_lens = [int(x) for x in args.prompt_lens.split(",")]
    args.variants = str_list(args.variants)
    unknown = [v for v in [*args.variants, args.profile] if v is not None and v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant {', '.join(unknown)}; the variants are {', '.join(sorted(VARIANTS))}")
    for flag in ("group_size", "rows", "agents", "response_len"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be 1 or more, got {getattr(args, flag)}")
    if min(args.prompt_lens) < 1:
        p.error(f"--prompt-lens must be 1 or more tokens each, got {args.prompt_lens}")
    return args


def make_batch(args: Any, vocab: int) -> Any:
    import numpy as np
    import torch

    from roll_ma.protocol import DataProto

    rng = np.random.default_rng(0)
    group = max(1, args.group_size)  # a group's rows repeat its first row's prompt
    lens: list[int] = []
    for a in range(args.agents):
        mean = args.prompt_lens[a % len(args.prompt_lens)]
        group_lens = [max(8, int(mean * rng.uniform(0.75, 1.25))) for _ in range(-(-args.rows // group))]
        lens += [n for n in group_lens for _ in range(group)][:args.rows]
    agent_ids = [a for a in range(args.agents) for _ in range(args.rows)]
    low = args.response_len // 4 if args.spread else args.response_len
    resp = rng.integers(low, args.response_len + 1, len(lens))
    n, P, R = len(lens), max(lens), args.response_len
    prompts = torch.zeros(n, P, dtype=torch.long)
    responses = torch.zeros(n, R, dtype=torch.long)
    mask = torch.zeros(n, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(lens, resp)):
        first = i % args.rows // group * group + i // args.rows * args.rows  # the group's first row
        prompts[i, P - p:] = prompts[first, P - p:] if first < i else torch.randint(3, vocab, (p,))
        responses[i, :r] = torch.randint(3, vocab, (int(r),))
        mask[i, P - p:P + r] = 1
    tensors = {"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], 1),
               "attention_mask": mask, "response_mask": mask[:, P:].float(),
               "advantages": torch.randn(n, 1).expand(n, R) * mask[:, P:].float()}
    return DataProto.from_dict(tensors, {"agent_id": agent_ids}, {"step": 0, "temperature": 1.0})


def build_strategy(args: Any, model_dir: str) -> Any:
    from roll_ma.config.schema import AgentConfig, AlgorithmConfig, LoraConfig, ModelConfig, TrainConfig
    from roll_ma.models.adapters import plan_adapters
    from roll_ma.training.multi_agent_deepspeed import MultiAgentDeepSpeedStrategy

    agents = [AgentConfig(name=f"agent{i}") for i in range(args.agents)]
    lora = LoraConfig(rank=args.lora_rank, alpha=2.0 * args.lora_rank,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
    agent_specs, adapter_specs = plan_adapters(lora, agents)
    train = TrainConfig(zero_stage=0, lr=2e-5, max_tokens_per_micro_batch=16384,
                        score_max_tokens_per_micro_batch=32768)
    model = ModelConfig(path=model_dir, dtype=args.dtype, gradient_checkpointing=True)
    strategy = MultiAgentDeepSpeedStrategy(model, agent_specs, adapter_specs, train,
                                           AlgorithmConfig(kl_coef=0.001))
    strategy.initialize()
    return strategy


def use_variant(strategy: Any, name: str) -> None:
    """Switch how rows run, in place: packing, checkpointing and token budgets."""
    from roll_ma.training.micro_batches import MicroBatching

    packed, ckpt, train_tokens, score_tokens, shared = VARIANTS[name]
    strategy.train_cfg = dataclasses.replace(strategy.train_cfg, remove_padding=packed,
                                             max_tokens_per_micro_batch=train_tokens,
                                             score_max_tokens_per_micro_batch=score_tokens,
                                             share_prompt_prefix=packed and shared)
    for updater in strategy.updaters.values():
        updater.batching = MicroBatching.for_training(strategy.train_cfg)
    base = strategy.model.get_base_model()
    if ckpt:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        base.gradient_checkpointing_disable()


def passes(strategy: Any, batch: Any) -> dict[str, Any]:
    """The three passes of a step: reference (adapters off), old log-probs, the update (pi_old given)."""
    ref = lambda: strategy.compute_log_probs(batch, adapters_enabled=False)  # noqa: E731
    old = lambda: strategy.compute_log_probs(batch)  # noqa: E731
    update = lambda: strategy.train_step(batch)  # noqa: E731
    return {"reference": ref, "old_log_probs": old, "update": update}


def pass_flops(batch: Any, shape: Any, name: str) -> dict[str, float]:
    """Model FLOPs each pass of ``name`` runs (a group's prompt once where the variant shares it); the
    update counted as two forwards (LoRA: no weight gradients of the frozen base)."""
    from roll_ma.metrics import forward_flops_of

    packed, _, _, _, shared = VARIANTS[name]
    forward = forward_flops_of(batch, shape, shared_prompts=packed and shared)
    return {"reference": forward, "old_log_probs": forward, "update": 2.0 * forward}


def measure(strategy: Any, batch: Any, name: str, shape: Any, peak: float, repeats: int) -> dict:
    import torch

    use_variant(strategy, name)
    flops = pass_flops(batch, shape, name)
    row: dict[str, Any] = {"variant": name}
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    for pass_name, fn in passes(strategy, batch).items():
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        try:
            seconds = warm_median_s(fn, repeats)  # the warm-up takes the optimizer's first step too
        except torch.OutOfMemoryError:
            row[f"{pass_name}_s"] = "OOM"
            torch.cuda.empty_cache()
            continue
        row[f"{pass_name}_s"] = round(seconds, 3)
        row[f"{pass_name}_tflops"] = round(flops[pass_name] / seconds / 1e12, 1)
        if peak:
            row[f"{pass_name}_mfu"] = round(flops[pass_name] / seconds / peak, 3)
        if torch.cuda.is_available():
            row[f"{pass_name}_peak_gb"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    return row


def profile(strategy: Any, batch: Any, name: str, trace: str | None) -> list[str]:
    """Top kernels of one reference pass and one update, and the share of wall clock with no kernel."""
    import time

    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    use_variant(strategy, name)
    notes = []
    gpu = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    for pass_name, fn in passes(strategy, batch).items():
        if pass_name == "old_log_probs":
            continue
        fn()
        cuda_sync()
        with torch_profile(activities=activities) as prof:
            start = time.perf_counter()
            fn()
            cuda_sync()
            wall = time.perf_counter() - start
        events = prof.key_averages()
        kernel_us = sum(e.self_device_time_total for e in events
                        if e.device_type == torch.autograd.DeviceType.CUDA)
        sort = "self_cuda_time_total" if gpu else "self_cpu_time_total"
        table = events.table(sort_by=sort, row_limit=18, max_name_column_width=60)
        print(f"\n### profile: {pass_name} ({name}), wall {wall:.2f} s, kernels {kernel_us / 1e6:.2f} s")
        print(table)
        notes.append(f"profile {pass_name} ({name}): wall {wall:.2f} s, GPU kernels {kernel_us / 1e6:.2f} s "
                     f"({100 * kernel_us / 1e6 / wall:.0f}% of the wall clock)")
        if trace and pass_name == "update":
            prof.export_chrome_trace(trace)
    return notes


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    setup_device(args)
    import torch

    from roll_ma.metrics import forward_flops_of
    from roll_ma.models.flops import ModelShape, peak_flops

    model_dir = prepare_model(args)
    strategy = build_strategy(args, model_dir)
    shape = ModelShape.of(strategy.model.get_base_model().config)
    batch = make_batch(args, min(shape.vocab, 150000))
    batch.batch["old_log_probs"] = strategy.compute_log_probs(batch).batch["old_log_probs"]
    batch.batch["ref_log_probs"] = strategy.compute_log_probs(batch, adapters_enabled=False).batch[
        "ref_log_probs"]
    forward = forward_flops_of(batch, shape)  # every row its own prompt
    forward_shared = forward_flops_of(batch, shape, shared_prompts=True)  # a group's prompt once
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    peak = peak_flops(device) if torch.cuda.is_available() else None
    tokens = int(batch.batch["attention_mask"].sum())
    log(f"{len(batch)} rows, {tokens} real tokens, forward {forward / 1e12:.1f} TFLOP "
        f"({forward_shared / 1e12:.1f} with a group's prompt once), peak {peak}")
    rows = [measure(strategy, batch, v, shape, peak or 0.0, args.repeats) for v in args.variants]
    notes = [f"{len(batch)} rows ({args.agents} agents x {args.rows}, groups of {args.group_size}), {tokens} "
             f"real tokens; forward {forward / 1e12:.1f} TFLOP with every row's own prompt, "
             f"{forward_shared / 1e12:.1f} with a group's prompt once (models/flops.py; each variant counts "
             f"what it runs), update counted as 2 forwards; peak {peak}"]
    if args.profile:
        notes += profile(strategy, batch, args.profile, args.trace)
    columns = ["variant"] + [f"{p}_{k}" for p in ("reference", "old_log_probs", "update")
                             for k in ("s", "mfu", "tflops", "peak_gb")]
    summary = {r["variant"]: {k: v for k, v in r.items() if k.endswith(("_s", "_mfu"))} for r in rows}
    return report("train_mfu", args, environment(args.device), columns, rows, summary, notes)


if __name__ == "__main__":
    main(sys.argv[1:])
