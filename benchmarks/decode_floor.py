"""Decode against the GPU's physical floor: the job's own rollout engine, ms a decode step at the job's batch,
beside the floor (weights and the KV cache read once a step, over the memory bandwidth), with no adapter, one
adapter and every agent's adapter mixed, a plain engine (no LoRA) and a profile of a step's GPU time.

    # on the GPU host; model.path: a local model (benchmarks use the random 7B of gpu_campaign.sh peers_model)
    python benchmarks/decode_floor.py --config math_selfplay_7b model.path=$MODEL --device cuda \\
        --new-tokens 256 --profile --out decode.json
    python benchmarks/decode_floor.py --config math_selfplay_tiny rollout.backend=vllm --device cpu   # smoke

The job file is the one source of the engine's settings (model.*, lora.*, agents, rollout.*: engine_kwargs,
max_num_seqs, gpu_memory_utilization, log-probs): the script builds roll_ma's own rollout strategy from the
validated config, as a run's rollout worker does, and samples as ``generate`` does (temperature, one
log-prob a token when rollout.log_probs, no detokenizing), adding only ``min_tokens = max_tokens`` and
``ignore_eos`` so that every row decodes exactly n tokens. Defaults from the job: the batch is one round of
it (env.groups_per_step x env.group_size), n is rollout.max_new_tokens, the contexts are a short prompt and
model.max_prompt_tokens (the length the math game's later turns are cut to).

Per engine, context and adapter mix: T1 = a generate of one new token (the prefill), Tn = exactly n new
tokens, each on fresh random prompts (no prefix-cache hits); decode ms a step = (Tn - T1) / (n - 1), the
median of --repeats. The floor of a step: (weight bytes + batch x mean context x KV bytes a token) /
bandwidth, with the GPU's nominal bandwidth and with a device-to-device copy measured here; the ratio is
decode ms over that floor. Engines, each in its own child process (vLLM frees GPU memory reliably only
with its process): ``lora`` (the job's engine), ``plain`` (the same, serving no adapters: no LoRA
kernels), and with --profile ``profile`` (the job's engine in-process, VLLM_ENABLE_V1_MULTIPROCESSING=0, so
that torch.profiler sees its kernels): kernel time a decode step by kind (GEMM, LoRA, attention, sampling,
norm/activation, other) for the mixed adapters and for no adapter, and the GPU-busy share of the step.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from common import environment, log, median, random_prompts, run_child, write_json

ENGINES = ("lora", "plain", "profile")
PROFILED_TOKENS = 64  # new tokens of a profiled generate
# nominal memory bandwidth, bytes/s, by a substring of the GPU's name (vendor data sheets, SXM parts)
NOMINAL_BANDWIDTH = {
    "H200": 4.8e12,
    "H100 PCIe": 2.0e12,
    "H100": 3.35e12,
    "A100-SXM4-80GB": 2.039e12,
    "A100 80GB PCIe": 1.935e12,
    "A100": 1.555e12,
    "L40S": 0.864e12,
}
# kernel kinds by substrings of a kernel's name, first match wins (CUDA kernels; aten ops on CPU)
KERNEL_KINDS = (
    ("lora", ("lora", "sgmv", "bgmv", "punica")),
    ("attention", ("flash", "fmha", "attn", "attention", "paged")),
    (
        "sampling",
        (
            "softmax",
            "sampl",
            "topk",
            "top_k",
            "sort",
            "argmax",
            "exponential",
            "gumbel",
            "multinomial",
            "logprob",
            "log_softmax",
            "penalt",
        ),
    ),
    (
        "gemm",
        (
            "gemm",
            "nvjet",
            "cutlass",
            "xmma",
            "cublas",
            "matmul",
            "aten::mm",
            "aten::addmm",
            "sm90_",
            "splitk",
            "linear",
        ),
    ),
    ("norm/activation", ("rms", "norm", "silu", "act_and_mul", "rotary", "rope", "gelu")),
)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="a shipped config's name or a yaml path (the job file)")
    p.add_argument(
        "overrides", nargs="*", help="key=value overrides of the job, as start_pipeline.py takes them"
    )
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    p.add_argument("--batch", type=int, default=None, help="rows a generate (default: one round of the job)")
    p.add_argument("--new-tokens", type=int, default=None, help="n (default: rollout.max_new_tokens)")
    p.add_argument("--contexts", default=None, help="prompt lengths, e.g. 64,2048 (default: 64,max_prompt)")
    p.add_argument("--engines", default="lora,plain", help=f"of {', '.join(ENGINES[:2])}")
    p.add_argument("--profile", action="store_true", help="also profile a decode step (one more engine)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--budget-s", type=float, default=540.0, help="start no engine past this many seconds")
    p.add_argument("--child-timeout-s", type=float, default=420.0)
    p.add_argument("--out", default=None, help="save the results as JSON here")
    p.add_argument("--engine", default=None, help=argparse.SUPPRESS)  # child: the one engine to measure
    p.add_argument("--child-out", dest="child_out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.engines = [e for e in args.engines.split(",") if e]
    unknown = [e for e in args.engines if e not in ENGINES[:2]]
    if unknown:
        p.error(f"unknown engine(s) {unknown}; known: {', '.join(ENGINES[:2])} (and --profile)")
    if args.profile:
        args.engines.append("profile")
    if args.contexts is not None:
        try:
            args.contexts = [int(x) for x in args.contexts.split(",") if x.strip()]
        except ValueError:
            p.error("--contexts must be prompt lengths like 64,2048")
    for name in ("batch", "new_tokens", "repeats"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.new_tokens == 1:
        p.error("--new-tokens must be at least 2: a decode step is what follows the first token")
    return args


def setup_environment(device: str) -> None:
    """Before torch or vLLM is imported."""
    if device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # not on the staged GPU image
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def load_job(args: argparse.Namespace) -> Any:
    """The validated job (every problem at once, as start_pipeline.py reports them)."""
    from roll_ma.config.compose import compose_raw
    from roll_ma.preflight.config_loader import build_config

    path = Path(args.config).expanduser()
    if path.suffix in (".yaml", ".yml"):
        raw = compose_raw(path.stem, str(path.resolve().parent), list(args.overrides))
    else:
        raw = compose_raw(args.config, None, list(args.overrides))
    return build_config(raw, check_env=False, check_local_gpus=args.device == "cuda")


def job_shape(cfg: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Batch, new tokens and contexts: the flags, else the job's."""
    return {
        "batch": args.batch or cfg.env.groups_per_step * cfg.env.group_size,
        "new_tokens": args.new_tokens or cfg.rollout.max_new_tokens,
        "contexts": args.contexts
        or sorted({min(64, cfg.model.max_prompt_tokens), cfg.model.max_prompt_tokens}),
    }


# ---------------------------------------------------------------------------- the floor
def model_bytes(model_dir: str) -> dict[str, float]:
    """Weight bytes (the safetensors files) and KV-cache bytes a token (2 x layers x KV heads x head dim x
    the dtype's bytes), from the model folder."""
    folder = Path(model_dir)
    weights = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    cfg = json.loads((folder / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    elem = 4 if "32" in dtype else 2
    kv = 2 * cfg["num_hidden_layers"] * cfg.get("num_key_value_heads", heads) * head_dim * elem
    return {"weight_bytes": float(weights), "kv_bytes_per_token": float(kv)}


def measured_bandwidth(device: str) -> float | None:
    """Bytes/s of a 2 GiB device-to-device copy (read + write), the best of 5; None on CPU."""
    if device != "cuda":
        return None
    import torch

    src = torch.empty(1 << 30, dtype=torch.int16, device="cuda")  # 2 GiB
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(6):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * 2 * (1 << 30) / best


def nominal_bandwidth(gpu_name: str) -> float | None:
    return next((bw for key, bw in NOMINAL_BANDWIDTH.items() if key in gpu_name), None)


def floor_ms(
    sizes: dict[str, float], batch: int, context: int, new_tokens: int, bandwidth: float | None
) -> float | None:
    """A decode step's bytes over the bandwidth: every weight once, and every row's KV cache at the mean
    context of its decode (prompt + half the new tokens)."""
    if not bandwidth:
        return None
    step_bytes = sizes["weight_bytes"] + batch * (context + new_tokens / 2) * sizes["kv_bytes_per_token"]
    return 1e3 * step_bytes / bandwidth


# ---------------------------------------------------------------------------- child: one engine
def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(k in low for k in keys)), "other")


def build_engine(cfg: Any, engine: str, device: str) -> tuple[Any, list[str]]:
    """roll_ma's rollout strategy for the job (``plain``: the same engine serving no adapters, so vLLM runs
    no LoRA kernels) and the names of the adapters it serves."""
    from roll_ma.inference import infer_strategy_class
    from roll_ma.models.adapters import plan_adapters

    agents, adapters = plan_adapters(cfg.lora, cfg.agents)
    if engine == "plain":
        agents, adapters = [], []
    strategy = infer_strategy_class(cfg.rollout.backend)(
        cfg.model, cfg.rollout, agents, adapters, cfg.seed, device
    )
    strategy.initialize()
    return strategy, [a.name for a in adapters]


def sampling(cfg: Any, new_tokens: int) -> Any:
    """``generate``'s sampling (temperature, one log-prob a token, no text) with exactly ``new_tokens``."""
    from vllm import SamplingParams

    return SamplingParams(
        n=1,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        max_tokens=new_tokens,
        min_tokens=new_tokens,
        ignore_eos=True,
        logprobs=0 if cfg.rollout.log_probs else None,
        detokenize=False,
    )


def engine_child(args: argparse.Namespace) -> None:
    cfg = load_job(args)
    shape = job_shape(cfg, args)
    t0 = time.perf_counter()
    strategy, names = build_engine(cfg, args.engine, args.device)
    start_s = time.perf_counter() - t0
    llm = strategy.llm
    vocab = len(strategy.tokenizer)
    mixes: dict[str, list[Any] | None] = {"none": None}
    if names:
        served = strategy.adapters_served
        mixes["1 adapter"] = [served.request(names[0])] * shape["batch"]
        mixes[f"{len(names)} mixed"] = [served.request(names[i % len(names)]) for i in range(shape["batch"])]
    if args.engine == "profile":  # the cases that tell where a step goes: every adapter, and none
        mixes = {k: v for k, v in mixes.items() if k == "none" or k.endswith("mixed")}
    seed = [cfg.seed + 1000]

    def generate(context: int, new: int, lora: list[Any] | None) -> float:
        seed[0] += 1  # fresh prompts every call: no prefix-cache hit
        prompts = random_prompts(shape["batch"], context, 3, vocab, seed[0])
        t = time.perf_counter()
        llm.generate(
            [{"prompt_token_ids": p} for p in prompts], sampling(cfg, new), lora_request=lora, use_tqdm=False
        )
        return time.perf_counter() - t

    rows, n = [], shape["new_tokens"]
    for context in shape["contexts"]:
        generate(context, 4, None)  # warm-up at this context
        for mix, lora in mixes.items():
            if args.engine == "profile":
                rows.append(
                    {"context": context, "adapters": mix, **profile_decode(generate, context, n, lora, args)}
                )
                continue
            prefill, full = [], []
            for _ in range(args.repeats):
                prefill.append(generate(context, 1, lora))
                full.append(generate(context, n, lora))
            step_ms = [1e3 * (f - p) / (n - 1) for f, p in zip(full, prefill, strict=True)]
            rows.append(
                {
                    "context": context,
                    "adapters": mix,
                    "decode_ms": median(step_ms),
                    "runs_ms": [round(x, 3) for x in step_ms],
                    "prefill_s": median(prefill),
                    "generate_s": median(full),
                }
            )
            log(f"{args.engine} context {context} {mix}: {median(step_ms):.2f} ms a decode step")
    vllm_config = getattr(llm.llm_engine, "vllm_config", None)
    scheduler = getattr(vllm_config, "scheduler_config", None)
    kwargs = {
        k: getattr(scheduler, k, None) for k in ("async_scheduling", "max_num_seqs", "max_num_batched_tokens")
    }
    compilation = getattr(vllm_config, "compilation_config", None)
    write_json(
        args.child_out,
        {
            "rows": [{"engine": args.engine, **r} for r in rows],
            "start_s": start_s,
            "shape": shape,
            "engine_config": {**kwargs, "cudagraph_mode": str(getattr(compilation, "cudagraph_mode", None))},
            "environment": environment(args.device),
        },
    )
    strategy.shutdown()


def profile_decode(
    generate: Any, context: int, n: int, lora: list[Any] | None, args: argparse.Namespace
) -> dict[str, Any]:
    """Kernel time a decode step by kind: a profiled n-token generate less a profiled 1-token one (the
    prefill), over n - 1 steps; busy = the sum of kernel time over the wall time of those steps. At most
    PROFILED_TOKENS new tokens: a step's make-up does not change with more, the profiler's records do."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    n = min(n, PROFILED_TOKENS)

    cuda = args.device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    totals, walls, top = [], [], {}
    for new in (1, n):
        with profile(activities=activities) as prof:
            walls.append(generate(context, new, lora))
        kinds: dict[str, float] = {}
        count = 0
        events = prof.key_averages()
        for event in events:
            us = event.self_device_time_total if cuda else event.self_cpu_time_total
            if us <= 0 or (cuda and event.device_type != torch.autograd.DeviceType.CUDA):
                continue
            if not cuda and not event.key.startswith("aten::"):
                continue
            kinds[kind_of(event.key)] = kinds.get(kind_of(event.key), 0.0) + us / 1e3
            count += event.count
        totals.append((kinds, count))
        if new == n:  # what the host and the GPU spent the decode on, by name (ms over the whole generate)
            by_cpu = sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]
            top["host_top_ms"] = {e.key[:80]: round(e.self_cpu_time_total / 1e3, 2) for e in by_cpu}
            if cuda:
                by_gpu = sorted(events, key=lambda e: -e.self_device_time_total)[:12]
                top["gpu_top_ms"] = {e.key[:80]: round(e.self_device_time_total / 1e3, 2) for e in by_gpu}
    (first, first_count), (full, full_count) = totals
    steps = n - 1
    per_step = {k: (full.get(k, 0.0) - first.get(k, 0.0)) / steps for k in set(full) | set(first)}
    wall_ms = 1e3 * (walls[1] - walls[0]) / steps
    kernel_ms = sum(per_step.values())
    out = {
        "decode_ms": wall_ms,
        "kernel_ms": kernel_ms,
        "busy": kernel_ms / wall_ms if wall_ms > 0 else None,
        "kernels_per_step": (full_count - first_count) / steps,
    }
    out.update({f"{k}_ms": round(v, 4) for k, v in sorted(per_step.items())})
    out.update(top, profiled_new_tokens=n)
    log(
        f"profile context {context}: {wall_ms:.2f} ms a step, kernels {kernel_ms:.2f} ms: "
        + ", ".join(f"{k} {v:.2f}" for k, v in sorted(per_step.items(), key=lambda kv: -kv[1]))
    )
    return out


# ---------------------------------------------------------------------------- parent
def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    setup_environment(args.device)
    if args.child_out:
        engine_child(args)
        return {}
    from roll_ma.errors import ConfigError

    try:
        cfg = load_job(args)  # a bad job fails here, in one message, before any engine starts
    except ConfigError as err:
        raise SystemExit(f"decode_floor.py: {err}") from None
    shape = job_shape(cfg, args)
    sizes = model_bytes(resolve_model_dir(cfg.model.path))
    measured = measured_bandwidth(args.device)
    engines: dict[str, Any] = {}
    started = time.perf_counter()
    for engine in args.engines:
        if time.perf_counter() - started > args.budget_s:
            log(f"skipping the {engine} engine: past --budget-s {args.budget_s}")
            continue
        env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if engine == "profile" else {}
        child_argv = [a for a in argv if a != "--profile"] + ["--engine", engine]
        try:
            engines[engine] = run_child(__file__, child_argv, timeout_s=args.child_timeout_s, env=env)
        except Exception as err:  # one engine failing must not lose the others' rows
            engines[engine] = {"error": repr(err)[:500]}
            log(f"the {engine} engine failed: {err!r}")
        if args.out:
            write_json(args.out, {"engines": engines, "shape": shape, "sizes": sizes})
    return summarize(args, cfg, shape, sizes, measured, engines)


def resolve_model_dir(path: str) -> str:
    from roll_ma.models.loading import resolve_model_path

    return resolve_model_path(path)


def summarize(
    args: argparse.Namespace,
    cfg: Any,
    shape: dict[str, Any],
    sizes: dict[str, float],
    measured: float | None,
    engines: dict[str, Any],
) -> dict[str, Any]:
    env = next((e["environment"] for e in engines.values() if "environment" in e), environment(args.device))
    nominal = nominal_bandwidth(env.get("machine", ""))
    rows = []
    for name, res in engines.items():
        if "error" in res:
            rows.append({"engine": name, "adapters": res["error"][:120]})
            continue
        for r in res["rows"]:
            nominal_floor = floor_ms(sizes, shape["batch"], r["context"], shape["new_tokens"], nominal)
            copy_floor = floor_ms(sizes, shape["batch"], r["context"], shape["new_tokens"], measured)
            rows.append(
                {
                    **r,
                    "floor_ms": nominal_floor,
                    "copy_floor_ms": copy_floor,
                    "x_floor": r["decode_ms"] / nominal_floor if nominal_floor else None,
                }
            )
    columns = [
        "engine",
        "context",
        "adapters",
        "decode_ms",
        "floor_ms",
        "x_floor",
        "copy_floor_ms",
        "prefill_s",
        "runs_ms",
        "busy",
        "kernel_ms",
        "gemm_ms",
        "lora_ms",
        "attention_ms",
        "sampling_ms",
        "norm/activation_ms",
        "other_ms",
        "kernels_per_step",
    ]
    notes = [
        f"job {args.config} {' '.join(args.overrides)}: batch {shape['batch']}, "
        f"{shape['new_tokens']} new tokens, "
        f"agents {[a.name for a in cfg.agents]}, LoRA rank {cfg.lora.rank} on {cfg.lora.target_modules}",
        f"weights {sizes['weight_bytes'] / 1e9:.3g} GB, "
        f"KV {sizes['kv_bytes_per_token'] / 1e3:.1f} kB a token; "
        f"bandwidth nominal {nominal / 1e12 if nominal else 0:.2f} TB/s, a measured 2 GiB copy "
        f"{measured / 1e12 if measured else 0:.2f} TB/s",
        "floor_ms = (weights + batch x (context + new/2) x KV a token) / nominal bandwidth; "
        "x_floor = decode_ms / floor_ms; copy_floor_ms the same over the measured copy's bandwidth",
        "engine lora: the job's engine; plain: the same with no adapters (no LoRA kernels); "
        "profile: the job's engine in-process under torch.profiler "
        "(busy = kernel time / wall time of the decode steps)",
        "engine settings: "
        + json.dumps({k: v.get("engine_config") for k, v in engines.items() if "rows" in v}),
    ]
    summary = {
        f"{r['engine']}|{r['context']}|{r['adapters']}": round(r["decode_ms"], 3)
        for r in rows
        if r.get("decode_ms") is not None
    }
    from common import report

    result = report(
        "decode_floor",
        argparse.Namespace(**{**vars(args), "out": None}),
        env,
        columns,
        rows,
        summary,
        notes,
        extra={
            "engines": engines,
            "shape": shape,
            "sizes": sizes,
            "bandwidth": {"nominal": nominal, "measured_copy": measured},
        },
    )
    if args.out:
        write_json(args.out, result)
    return result


if __name__ == "__main__":
    main()
