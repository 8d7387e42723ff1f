"""Adapter sync latency: pushing 1 or 3 agents' adapters into a running rollout engine, against a full
reload of the base weights; plus sleep(level=1) / wake_up() time and the GPU memory sleep frees.

    python benchmarks/adapter_sync.py                                         # CPU, tiny model, ~1 min
    python benchmarks/adapter_sync.py --device cuda --shape qwen2.5-0.5b --out adapter_sync.json
        # GPU (H100): ~2 min (vLLM child ~1.5 min with an eager engine, HF child ~20 s);
        # --cuda-graphs measures sleep/wake with CUDA graphs too (+1 min of engine start)

Each backend runs in its own child process with roll_ma's rollout strategy serving 3 agents (one
rank-16 adapter each, all linear layers) and measures, median of ``--repeats`` after one warm-up:

- ``update_adapters`` of 1 adapter and of 3 (what the pipeline's sync step calls). vLLM: the strategy
  writes a PEFT dir to /dev/shm, registers it under a new LoRA name/id, drops the old one and resets the
  prefix cache; the GPU slot is filled at the next request that uses the adapter, so the first generate
  after a sync (every agent, 1 token) is timed too, next to the same generate without a sync.
  HF: an in-place copy of the PEFT tensors.
- the full base: vLLM ``llm.collective_rpc("reload_weights")`` (the worker re-reads every safetensors file
  of the model dir, page cache warm, and loads it in place). vLLM 0.32 (CPU) does this in the LoRA engine;
  vLLM 0.25 (GPU) cannot (its loader looks for ``...down_proj.weight`` where LoRA wrapping put
  ``...down_proj.base_layer.weight``), so there the LoRA engine is shut down and the reload is timed on a
  plain engine of the same model, which is what a full-weight sync (merged weights) runs on anyway;
  ``--full-reload plain`` forces that path. HF: ``load_state_dict``
  of the full base state dict from CPU tensors (a full-weight sync's copy, without any transfer between
  processes).
- ``sleep(level=1)`` / ``wake_up()`` and the device-wide GPU memory in use before, asleep and awake
  (``torch.cuda.mem_get_info``: vLLM's engine core is another process). No sleep mode on CPU.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from common import (
    add_rollout_args,
    base_parser,
    build_rollout,
    environment,
    gpu_used_bytes,
    log,
    median,
    merge_previous,
    prepare_model,
    random_adapter_tensors,
    report,
    run_child,
    setup_device,
    str_list,
    timed,
    write_json,
)

NUM_AGENTS = 3


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = base_parser(__doc__)
    p.add_argument("--backends", type=str_list, default=["vllm", "hf"])
    p.add_argument("--backend", default=None, help=argparse.SUPPRESS)  # the child's one backend
    p.add_argument(
        "--full-reload",
        choices=["inplace", "plain"],
        default="inplace",
        help="vllm: time reload_weights in the LoRA engine (falls back to a plain engine) or in a plain one",
    )
    add_rollout_args(p, eager_default=True)
    args = p.parse_args(argv)
    unknown = sorted(set(args.backends) - {"vllm", "hf"})
    if unknown:
        p.error(f"unknown backends {unknown}: use --backends vllm,hf")
    return args


def tensor_bytes(tensors: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def repeat(fn, repeats: int) -> list[float]:
    """One warm-up call, then ``repeats`` timed calls (seconds)."""
    fn()
    return [timed(fn)[0] for _ in range(repeats)]


def first_token_all_agents(strategy: Any) -> None:
    """One request per agent, 1 new token: what a rollout right after a sync pays first."""
    from roll_ma.protocol import DataProto
    from roll_ma.protocol.requests import GenerateRequest

    rows = DataProto.from_dict(
        non_tensors={"prompt_ids": [[5, 6, 7, 8]] * NUM_AGENTS, "agent_id": list(range(NUM_AGENTS))},
    )
    strategy.generate(rows, GenerateRequest(max_new_tokens=1, temperature=1.0))


def full_reload(backend: str, strategy: Any) -> tuple[Any, str, int]:
    """(a function that reloads the full base once, what it does, the base's bytes)."""
    if backend == "vllm":
        from pathlib import Path

        files = Path(strategy.model_cfg.path).glob("*.safetensors")
        return (
            lambda: strategy.llm.collective_rpc("reload_weights"),
            "vllm: collective_rpc('reload_weights'), the safetensors re-read from disk into the engine",
            sum(f.stat().st_size for f in files),  # the checkpoint's bytes
        )
    base = {
        k: v.detach().to("cpu").clone() for k, v in strategy.model.state_dict().items() if "lora_" not in k
    }

    def copy() -> None:
        result = strategy.model.load_state_dict(base, strict=False)
        assert not result.unexpected_keys, result.unexpected_keys[:3]

    return copy, "hf: load_state_dict of the full base state dict from CPU tensors", tensor_bytes(base)


def child_main(args: argparse.Namespace) -> None:
    backend, reps = args.backend, args.repeats
    strategy, specs, start_s = build_rollout(args, backend, NUM_AGENTS)
    states = random_adapter_tensors(args.model, args.dtype, specs, args.seed + 1)
    names = [s.name for s in specs]
    version = iter(range(2, 10**6))
    rows: list[dict[str, Any]] = []

    def row(op: str, secs: list[float], **extra: Any) -> None:
        rows.append(
            {
                "backend": backend,
                "operation": op,
                "median_ms": 1e3 * median(secs),
                "runs_ms": [round(1e3 * s, 2) for s in secs],
                **extra,
            }
        )
        log(f"{backend} {op}: {1e3 * median(secs):.2f} ms")

    adapter_bytes = tensor_bytes(states[names[0]])
    per_adapter: list[float] = []
    for count in (1, NUM_AGENTS):
        push = {n: states[n] for n in names[:count]}

        def sync(push: dict = push) -> None:
            per_adapter.extend(strategy.update_adapters(push, next(version)).values())

        per_adapter.clear()
        secs = repeat(sync, reps)
        row(
            f"update_adapters: {count} adapter(s)",
            secs,
            bytes=adapter_bytes * count,
            per_adapter_ms=round(1e3 * median(per_adapter), 3),
        )

    def sync_then_generate() -> None:
        strategy.update_adapters({n: states[n] for n in names}, next(version))
        first_token_all_agents(strategy)

    row(f"update {NUM_AGENTS} + first generate (1 token per agent)", repeat(sync_then_generate, reps))
    row("generate alone (1 token per agent, no sync)", repeat(lambda: first_token_all_agents(strategy), reps))

    if args.device == "cuda":
        used, asleep, awake, sleep_s, wake_s = [], [], [], [], []
        for _ in range(reps):
            used.append(gpu_used_bytes())
            sleep_s.append(timed(lambda: strategy.sleep(1))[0])
            asleep.append(gpu_used_bytes())
            wake_s.append(timed(strategy.wake_up)[0])
            awake.append(gpu_used_bytes())
        freed = median([u - a for u, a in zip(used, asleep, strict=True)]) / 2**30
        row(
            "sleep(level=1)",
            sleep_s,
            freed_gib=round(freed, 2),
            used_gib=round(median(used) / 2**30, 2),
            asleep_gib=round(median(asleep) / 2**30, 2),
        )
        row("wake_up()", wake_s, awake_gib=round(median(awake) / 2**30, 2))
        first_token_all_agents(strategy)

    # last: an engine that breaks on an in-place reload costs only this row
    reload, how, base_bytes = full_reload(backend, strategy)
    result = {"rows": rows, "start_s": start_s, "adapter_bytes": adapter_bytes, "base_bytes": base_bytes}

    def reload_row(fn: Any, how: str) -> str | None:
        """Time ``fn`` as the full base reload row; the error instead when it fails."""
        try:
            row("full base reload", repeat(fn, reps), bytes=base_bytes, how=how)
            return None
        except Exception as err:
            log(f"{backend} full base reload failed ({how}): {err!r}")
            return repr(err)[:200]

    forced_plain = backend == "vllm" and args.full_reload == "plain"
    error = "--full-reload plain" if forced_plain else reload_row(reload, how)
    if error is None:
        first_token_all_agents(strategy)  # the engine still serves after the reload
    write_json(args.child_out, result)  # before the shutdown, which a broken engine may fail
    strategy.shutdown()
    if error is not None and backend == "vllm":
        # vLLM 0.25 cannot reload a LoRA-wrapped model in place: time it on a plain engine of the same model
        llm = plain_vllm_engine(args)
        how = f"vllm: collective_rpc('reload_weights') on a plain engine (in the LoRA engine: {error})"
        error = reload_row(lambda: llm.collective_rpc("reload_weights"), how)
    if error is not None:
        rows.append(
            {
                "backend": backend,
                "operation": "full base reload",
                "median_ms": None,
                "how": f"{how}: FAILED {error}",
                "bytes": base_bytes,
            }
        )
    write_json(args.child_out, result)


def plain_vllm_engine(args: argparse.Namespace) -> Any:
    """A vLLM engine of the same model and settings without LoRA (what a full-weight sync serves from)."""
    from vllm import LLM

    t0 = time.perf_counter()
    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enforce_eager=args.eager or args.device == "cpu",
        seed=args.seed,
    )
    log(f"vllm: plain engine (no LoRA) ready in {time.perf_counter() - t0:.1f} s")
    return llm


def main(argv: list[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    setup_device(args)
    if args.child_out:
        child_main(args)
        return {}
    model_label = args.model or f"random {args.shape}"
    args.model = prepare_model(args)
    rows, starts = [], {}
    for backend in args.backends:
        res = run_child(__file__, [*argv, "--model", args.model, "--backend", backend])
        rows += res["rows"]
        starts[backend] = round(res["start_s"], 1)
    rows = merge_previous("adapter_sync", args.out, rows, ("backend", "operation"))
    summary, notes = {}, []
    for backend in dict.fromkeys(r["backend"] for r in rows):
        ops = {r["operation"]: r for r in rows if r["backend"] == backend}
        one = ops["update_adapters: 1 adapter(s)"]["median_ms"]
        full = ops["full base reload"]["median_ms"] or float("nan")
        notes.append(ops["full base reload"]["how"])
        summary[f"{backend}_update_1_ms"] = round(one, 3)
        summary[f"{backend}_update_3_ms"] = round(
            ops[f"update_adapters: {NUM_AGENTS} adapter(s)"]["median_ms"], 3
        )
        summary[f"{backend}_full_reload_ms"] = round(full, 3)
        summary[f"{backend}_full_over_1_adapter"] = round(full / one, 1)
        if "sleep(level=1)" in ops:
            summary[f"{backend}_sleep_ms"] = round(ops["sleep(level=1)"]["median_ms"], 2)
            summary[f"{backend}_wake_ms"] = round(ops["wake_up()"]["median_ms"], 2)
            summary[f"{backend}_freed_gib"] = ops["sleep(level=1)"]["freed_gib"]
        for r in ops.values():
            r["vs_1_adapter"] = r["median_ms"] / one if r["median_ms"] is not None else None
    notes += [
        f"model {model_label}, {args.dtype}; {NUM_AGENTS} agents, LoRA rank {args.lora_rank} on "
        f"{', '.join(args.targets) if args.targets else 'all linear layers'}; vLLM "
        f"{'eager' if args.eager or args.device == 'cpu' else 'with CUDA graphs'}; start s: {starts}",
        "median of --repeats after one warm-up; GPU memory is device-wide (mem_get_info)",
    ]
    if args.device == "cpu":
        notes.append("sleep/wake are no-ops on CPU (no sleep mode): not measured")
    return report(
        "adapter_sync",
        args,
        environment(args.device),
        [
            "backend",
            "operation",
            "median_ms",
            "runs_ms",
            "vs_1_adapter",
            "bytes",
            "per_adapter_ms",
            "freed_gib",
            "used_gib",
            "asleep_gib",
            "awake_gib",
        ],
        rows,
        summary,
        notes,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
