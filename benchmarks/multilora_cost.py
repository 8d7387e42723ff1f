"""The cost of serving 3 agents' LoRA adapters at once in vLLM, at 7B, and the engine levers that cut it.

    # on the GPU host; the first call writes the random 7B model (~15 GB, ~1 min) into --model-dir
    python benchmarks/multilora_cost.py --device cuda --out m.json --levers baseline,default,targets
    python benchmarks/multilora_cost.py --device cuda --out m.json --levers slots,targets+slots,specialize
    python benchmarks/multilora_cost.py --device cuda --out m.json --levers graphs,tokens,dual_stream
        # each chunk ~6-8 min on an H100 (every lever is a fresh engine: ~1.5-2 min start + ~30 s measuring);
        # results are appended to --out and every call prints the table of all levers so far

Model: a random Qwen2.5-7B-shaped Qwen2 (bf16, vocab 152064 with a tokenizer padded to it), written once
with weights drawn on the GPU and saved as safetensors shards, reused when ``--model-dir`` holds it.
Adapters: 3 random nonzero rank-16 PEFT adapters on q, k, v, o; in every LoRA run row i uses adapter
i mod 3 (all 3 live: merging is not an option when every agent's adapter must stay servable).
Workloads (exactly K output tokens per row, EOS ignored, temperature 1): decode-heavy 256 prompts x 64
tokens -> 256 new; prefill-heavy 64 x 1024 -> 32. Output tokens/s, median of ``--repeats`` after a
warm-up, each lever's ratio to ``baseline`` (a plain engine without LoRA = 1.0x).

Levers (vLLM 0.25 engine args; ``a+b`` combines levers, later ones win):
  baseline     enable_lora=False
  default      enable_lora=True, max_loras=8, max_lora_rank=64: a LoRA engine sized with room to spare;
               also measures decode with no adapter in the requests on this LoRA engine
  targets      lora_target_modules=[q_proj, k_proj, v_proj, o_proj]: wrap only the adapters' targets
               (vLLM otherwise wraps every supported linear layer, MLP included)
  slots        max_loras=3, max_lora_rank=16: exactly the adapters served (roll_ma's VLLMInferStrategy
               sizes its engine this way)
  specialize   specialize_active_lora=True: kernel grid / CUDA graphs by the number of active adapters
  graphs       max_num_seqs=256 + compilation_config.cudagraph_capture_sizes up to 256
  tokens       max_num_batched_tokens=65536: a whole prefill-heavy batch in one scheduler step
  dual_stream  env VLLM_LORA_ENABLE_DUAL_STREAM=1: LoRA kernels on a second CUDA stream beside the base GEMM
  sharded      fully_sharded_loras=True (meant for tensor parallelism; expected no-op at TP=1)
  eager        enforce_eager=True: what CUDA graphs are worth here
  tuned        env VLLM_TUNED_CONFIG_FOLDER=--tuned-config-dir: tuned shrink/expand Triton configs. vLLM 0.25
               reads ``{GPU}_SHRINK.json`` / ``{GPU}_EXPAND_{TRUE|FALSE}.json`` there; making them is a
               separate grid search (vLLM's benchmarks/kernels/benchmark_lora.py, not in the wheel): skipped
               unless the folder is given.
Every lever runs in a fresh child process (vLLM does not free GPU memory reliably within one process).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from common import (
    base_parser,
    environment,
    log,
    median,
    random_prompts,
    report,
    run_child,
    setup_device,
    str_list,
    write_json,
)

NUM_ADAPTERS, TARGETS = 3, ["q_proj", "k_proj", "v_proj", "o_proj"]
PROMPT_IDS = (3, 256)  # prompt token ids: byte tokens of the built-in BPE (0-2 are special)
GENEROUS = {"enable_lora": True, "max_loras": 8, "max_lora_rank": 64, "max_cpu_loras": 8}
LEVERS: dict[str, dict[str, Any]] = {
    "baseline": {"kwargs": {"enable_lora": False}},
    "default": {"kwargs": {}},
    "targets": {"kwargs": {"lora_target_modules": TARGETS}},
    "slots": {"kwargs": {"max_loras": NUM_ADAPTERS, "max_lora_rank": 16, "max_cpu_loras": NUM_ADAPTERS}},
    "specialize": {"kwargs": {"specialize_active_lora": True}},
    "graphs": {
        "kwargs": {
            "max_num_seqs": 256,
            "compilation_config": {"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 32, 64, 128, 192, 256]},
        }
    },
    "tokens": {"kwargs": {"max_num_batched_tokens": 65536}},
    "dual_stream": {"kwargs": {}, "env": {"VLLM_LORA_ENABLE_DUAL_STREAM": "1"}},
    "sharded": {"kwargs": {"fully_sharded_loras": True}},
    "eager": {"kwargs": {"enforce_eager": True}},
    "tuned": {"kwargs": {}, "env": {"VLLM_TUNED_CONFIG_FOLDER": None}},  # filled from --tuned-config-dir
}


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = base_parser(__doc__)
    p.set_defaults(shape="qwen2.5-7b", device="cuda")
    p.add_argument(
        "--model-dir", default="/tmp/roll_ma_random_qwen2.5-7b", help="random model: built once here"
    )
    p.add_argument("--levers", type=str_list, default=["baseline", "default", "targets"])
    p.add_argument("--decode", default="256x64x256", help="decode-heavy workload: prompts x prompt_len x new")
    p.add_argument(
        "--prefill", default="64x1024x32", help="prefill-heavy workload: prompts x prompt_len x new"
    )
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument(
        "--tuned-config-dir", default=None, help="folder of tuned LoRA kernel configs (lever tuned)"
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="start no further lever once this many seconds have passed (keep a call < 10 min)",
    )
    p.add_argument("--child-timeout-s", type=float, default=420.0)
    p.add_argument("--lever", default=None, help=argparse.SUPPRESS)  # child: the one lever to measure
    p.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)  # child: write the model
    args = p.parse_args(argv)
    for lever in args.levers:
        unknown = [part for part in lever.split("+") if part not in LEVERS]
        if unknown:
            p.error(f"unknown lever(s) {unknown} in {lever!r}; known: {', '.join(LEVERS)}")
    for name in ("decode", "prefill"):
        try:
            n, plen, new = (int(x) for x in getattr(args, name).split("x"))
        except ValueError:
            p.error(f"--{name} must look like 256x64x256 (prompts x prompt tokens x new tokens)")
        setattr(args, name, (n, plen, new))
    return args


# ---------------------------------------------------------------------------- model + adapters
def build_random_model(
    out_dir: Path, shape: str, dtype: str, device: str, seed: int, shard_bytes: int = 4 << 30
) -> None:
    """Write a random model of ``shape`` fast: every tensor drawn on ``device`` (N(0, 0.02); norms 1,
    biases 0), saved straight to safetensors shards with an HF index; a ``.complete`` marker comes last.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, GenerationConfig

    from roll_ma.models.tiny import make_config
    from roll_ma.models.tiny_tokenizer import build_tokenizer

    out_dir.mkdir(parents=True, exist_ok=True)
    config = make_config("qwen2", shape=shape)
    tokenizer = build_tokenizer(pad_vocab_to=config.vocab_size)  # every id the model samples decodes
    config.eos_token_id, config.pad_token_id, config.bos_token_id = (
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
        None,
    )
    config.dtype = dtype
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    shapes = {k: v.shape for k, v in skeleton.state_dict().items()}
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)  # stored once, as the embedding
    gen = torch.Generator(device=device).manual_seed(seed)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, shp in shapes.items():
        t = torch.empty(shp, dtype=getattr(torch, dtype), device=device)
        if name.endswith("norm.weight"):
            t.fill_(1.0)
        elif name.endswith(".bias"):
            t.zero_()
        else:
            t.normal_(0.0, 0.02, generator=gen)
        nbytes = t.numel() * t.element_size()
        if size + nbytes > shard_bytes and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][name] = t.cpu()
        size += nbytes
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out_dir / fname), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in shard.values())
        weight_map.update(dict.fromkeys(shard, fname))
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config.save_pretrained(out_dir)
    GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    ).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    (out_dir / ".complete").write_text(f"{total}\n")


def write_adapters(model_dir: Path, rank: int, seed: int) -> list[str]:
    """3 random nonzero PEFT adapters on TARGETS (shapes from the config, no base weights loaded), written
    once into a temp folder named after the model and the rank (never into a user's model dir)."""
    import tempfile
    import zlib

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from roll_ma.models.adapters import AdapterSpec, write_adapter_dir

    tag = f"{zlib.crc32(str(model_dir.resolve()).encode()):08x}_r{rank}_s{seed}"
    root = Path(tempfile.gettempdir()) / f"roll_ma_multilora_adapters_{tag}"
    paths = [root / f"a{i}" for i in range(NUM_ADAPTERS)]
    if all((p / "adapter_model.safetensors").exists() for p in paths):
        return [str(p) for p in paths]
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    linears = [
        (n, m)
        for n, m in skeleton.named_modules()
        if isinstance(m, torch.nn.Linear) and n.split(".")[-1] in TARGETS
    ]
    gen = torch.Generator().manual_seed(seed)
    for i, path in enumerate(paths):
        tensors = {}
        for name, m in linears:
            key = f"base_model.model.{name}"
            tensors[f"{key}.lora_A.weight"] = (
                torch.randn(rank, m.in_features, generator=gen) * m.in_features**-0.5
            )
            tensors[f"{key}.lora_B.weight"] = torch.randn(m.out_features, rank, generator=gen) * 0.01
        spec = AdapterSpec(f"a{i}", rank, 2.0 * rank, 0.0, tuple(TARGETS))
        write_adapter_dir({k: v.to(torch.bfloat16) for k, v in tensors.items()}, spec, path)
    return [str(p) for p in paths]


def describe(lever: str) -> str:
    """What a lever (or 'a+b') changes, on top of the common engine args."""
    parts = []
    for part in lever.split("+"):
        spec = LEVERS[part]
        parts += [f"{k}={json.dumps(v)}" for k, v in spec["kwargs"].items()]
        parts += [f"env {k}={v or '<--tuned-config-dir>'}" for k, v in spec.get("env", {}).items()]
    return ", ".join(parts) or "(nothing)"


# ---------------------------------------------------------------------------- child: one lever
def lever_settings(lever: str, args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, str]]:
    """(vllm.LLM kwargs, environment) of a lever or an 'a+b' combination."""
    kwargs = dict(
        model=str(args.model_dir),
        dtype=args.dtype,
        seed=args.seed,
        max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        **GENEROUS,
    )
    env: dict[str, str] = {}
    for part in lever.split("+"):
        spec = LEVERS[part]
        for key, value in spec["kwargs"].items():
            if isinstance(value, dict) and isinstance(kwargs.get(key), dict):
                value = {**kwargs[key], **value}
            kwargs[key] = value
        for key, value in spec.get("env", {}).items():
            env[key] = args.tuned_config_dir if key == "VLLM_TUNED_CONFIG_FOLDER" else value
    if not kwargs["enable_lora"]:
        kwargs = {k: v for k, v in kwargs.items() if k not in GENEROUS or k == "enable_lora"}
    return kwargs, env


def lever_child(args: argparse.Namespace) -> None:
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    kwargs, _ = lever_settings(args.lever, args)
    start = time.perf_counter()
    llm = LLM(**kwargs)
    start_s = time.perf_counter() - start
    lora = kwargs.get("enable_lora", False)
    requests = [
        LoRARequest(f"a{i}", i + 1, p)
        for i, p in enumerate(write_adapters(args.model_dir, args.lora_rank, args.seed))
    ]

    def run(prompts: list[list[int]], new: int, adapters: bool) -> tuple[float, int]:
        params = SamplingParams(temperature=1.0, max_tokens=new, min_tokens=new, ignore_eos=True)
        lrs = [requests[i % NUM_ADAPTERS] for i in range(len(prompts))] if adapters else None
        llm.reset_prefix_cache()
        t0 = time.perf_counter()
        outs = llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, lora_request=lrs, use_tqdm=False
        )
        return time.perf_counter() - t0, sum(len(o.outputs[0].token_ids) for o in outs)

    cases = [("decode", args.decode, lora), ("prefill", args.prefill, lora)]
    if lora and args.lever == "default":
        cases.append(("decode", args.decode, False))  # the LoRA engine serving rows without an adapter
    rows = []
    for workload, (n, plen, new), adapters in cases:
        run(random_prompts(n, plen, *PROMPT_IDS, args.seed), max(1, new // 8), adapters)  # warm-up
        secs, toks = [], []
        for r in range(args.repeats):
            s, t = run(random_prompts(n, plen, *PROMPT_IDS, args.seed + 1 + r), new, adapters)
            secs.append(s)
            toks.append(t)
        rates = [t / s for t, s in zip(toks, secs, strict=True)]
        rows.append(
            {
                "lever": args.lever,
                "workload": f"{workload} {n}x{plen}->{new}",
                "adapters": f"{NUM_ADAPTERS} mixed" if adapters else "none",
                "out_tok_s": median(rates),
                "runs_tok_s": [round(x) for x in rates],
                "total_tok_s": median([(t + n * plen) / s for t, s in zip(toks, secs, strict=True)]),
                "start_s": start_s,
            }
        )
        log(f"{args.lever} {workload} adapters={adapters}: {median(rates):.0f} out tok/s")
    write_json(
        args.child_out,
        {
            "rows": rows,
            "kwargs": {k: v for k, v in kwargs.items() if k != "model"},
            "environment": environment(args.device),
        },
    )


# ---------------------------------------------------------------------------- parent
def ensure_model(args: argparse.Namespace, argv: list[str]) -> None:
    """Build the random model in --model-dir unless it is there already (or --model names one)."""
    if args.model or (args.model_dir / ".complete").exists():
        log(f"using the model in {args.model_dir}")
        return
    start = time.perf_counter()
    run_child(__file__, [*argv, "--build-only"])  # a child: this process never holds GPU memory
    log(f"wrote the random {args.shape} model to {args.model_dir} in {time.perf_counter() - start:.0f} s")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    setup_device(args)
    args.model_dir = Path(args.model or args.model_dir)
    if args.child_out and args.build_only:
        build_random_model(args.model_dir, args.shape, args.dtype, args.device, args.seed)
        write_adapters(args.model_dir, args.lora_rank, args.seed)
        write_json(args.child_out, {})
        return {}
    if args.child_out:
        lever_child(args)
        return {}
    ensure_model(args, argv)
    results = json.loads(Path(args.out).read_text()) if args.out and Path(args.out).exists() else {}
    levers: dict[str, Any] = results.get("levers", {})
    env_info, started, longest = results.get("environment"), time.perf_counter(), 150.0
    for lever in args.levers:
        elapsed = time.perf_counter() - started
        if elapsed + longest > args.budget_s:
            log(f"skipping {lever}: {elapsed:.0f} s + ~{longest:.0f} s would pass --budget-s {args.budget_s}")
            continue
        kwargs, env = lever_settings(lever, args)
        if "VLLM_TUNED_CONFIG_FOLDER" in env and not env["VLLM_TUNED_CONFIG_FOLDER"]:
            log("skipping tuned: no --tuned-config-dir (tuning is a separate grid search, see the docstring)")
            continue
        t0 = time.perf_counter()
        try:
            res = run_child(__file__, [*argv, "--lever", lever], timeout_s=args.child_timeout_s, env=env)
            levers[lever] = {"rows": res["rows"], "kwargs": res["kwargs"], "env": env}
            env_info = res["environment"]
        except Exception as err:  # one lever failing (an engine arg this vLLM lacks) must not lose the rest
            levers[lever] = {"error": repr(err)[:500], "env": env}
            log(f"lever {lever} failed: {err!r}")
        longest = max(longest, time.perf_counter() - t0)
        if args.out:  # after every lever: a killed call keeps what it measured
            write_json(args.out, {**results, "levers": levers, "environment": env_info})
    return summarize(args, levers, env_info or environment("cpu"))


def summarize(args: argparse.Namespace, levers: dict[str, Any], env_info: dict[str, Any]) -> dict[str, Any]:
    base = {r["workload"]: r["out_tok_s"] for r in levers.get("baseline", {}).get("rows", [])}
    rows = []
    for lever, res in levers.items():
        if "error" in res:
            rows.append({"lever": lever, "workload": "error", "adapters": res["error"][:120]})
            continue
        for r in res["rows"]:
            ratio = r["out_tok_s"] / base[r["workload"]] if r["workload"] in base else None
            rows.append({**r, "vs_baseline": ratio})
    summary = {
        f"{r['lever']}|{r['workload'].split()[0]}|{r['adapters']}": round(r["vs_baseline"], 3)
        for r in rows
        if r.get("vs_baseline") is not None
    }
    notes = [
        f"model {args.model_dir} ({args.shape} shape, random, {args.dtype}); {NUM_ADAPTERS} "
        f"rank-{args.lora_rank} adapters on {', '.join(TARGETS)}; row i uses adapter i mod {NUM_ADAPTERS}",
        "vs_baseline = output tok/s / plain engine (no LoRA) on the same workload; run 'baseline' first",
        "common engine args: "
        + json.dumps(
            {
                **GENEROUS,
                "gpu_memory_utilization": args.gpu_memory_utilization,
                "max_model_len": args.max_model_len,
            }
        ),
        "levers: " + "; ".join(f"{name} = {describe(name)}" for name in levers),
    ]
    out = dict(vars(args))
    out["model_dir"] = str(args.model_dir)
    result = report(
        "multilora_cost",
        argparse.Namespace(**{**out, "out": None}),
        env_info,
        ["lever", "workload", "adapters", "out_tok_s", "vs_baseline", "runs_tok_s", "total_tok_s", "start_s"],
        rows,
        summary,
        notes,
    )
    if args.out:  # the merged file keeps every lever measured so far
        write_json(args.out, {**result, "levers": levers})
    return result


if __name__ == "__main__":
    main()
