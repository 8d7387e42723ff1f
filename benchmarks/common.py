"""Helpers shared by the benchmark scripts: arguments, the machine, the model, tables, results, children.

Every script prints a markdown table, one ``JSON {...}`` summary line and the machine it ran on,
and saves the whole result with ``--out FILE.json``. Scripts that start vLLM engines run each
engine in a fresh child process (``run_child``): vLLM does not give GPU memory back reliably
within one process, and a crashed engine then costs one measurement, not the whole run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
CHILD_FLAG = "--child-out"  # a script run with it is a child: it writes its result there, prints no report


# ---------------------------------------------------------------------------- arguments
def base_parser(doc: str | None) -> argparse.ArgumentParser:
    """Arguments every benchmark takes: device, model shape or directory, dtype, repeats, output file."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--shape", default="tiny", help="model shape from roll_ma.models.tiny.SHAPES")
    p.add_argument("--model", default=None, help="model directory (default: a random model of --shape)")
    p.add_argument(
        "--vocab-size",
        type=int,
        default=512,
        help="vocab of the random model when the shape sets none (tiny)",
    )
    p.add_argument("--dtype", default=None, help="weights dtype (default: float32 on cpu, bfloat16 on cuda)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per measurement (the median is shown)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="save the results as JSON here")
    p.add_argument(CHILD_FLAG, dest="child_out", default=None, help=argparse.SUPPRESS)
    return p


def add_rollout_args(p: argparse.ArgumentParser, eager_default: bool) -> None:
    """Adapters and vLLM engine settings of scripts that build a rollout strategy."""
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--targets", type=str_list, default=None, help="LoRA target modules (default: all linear)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5, help="vLLM's share of the GPU")
    if eager_default:
        p.add_argument(
            "--cuda-graphs",
            dest="eager",
            action="store_false",
            help="vLLM with CUDA graphs (default: eager, for a faster engine start)",
        )
    else:
        p.add_argument("--eager", action="store_true", help="vLLM without CUDA graphs (always so on cpu)")


def setup_device(args: argparse.Namespace) -> None:
    """Environment for the chosen device; call before torch or vLLM is imported."""
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch loads: strategies use any GPU they see
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # not on the staged GPU image
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda but no GPU is visible")


def prepare_model(args: argparse.Namespace) -> str:
    """``--model`` if given, else a random model of ``--shape`` (nothing downloaded), built once into a
    temp folder named after shape, dtype, vocab, seed and the builder's code, reused by later calls."""
    if args.model:
        return args.model
    import zlib

    from roll_ma.models import tiny
    from roll_ma.models import tiny_tokenizer as tokenizer
    from roll_ma.models.tiny import build_tiny_model

    # the builder's source in the name: a changed builder never reuses an old model
    code = zlib.crc32(b"".join(Path(m.__file__).read_bytes() for m in (tiny, tokenizer)))
    name = f"{args.shape}_{args.dtype}_v{args.vocab_size}_s{args.seed}_{code:08x}"
    path = Path(tempfile.gettempdir()) / "roll_ma_bench_models" / name
    if (path / "config.json").exists():
        log(f"reusing the random {args.shape} model in {path}")
        return str(path)
    start = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{name}.", dir=path.parent))
    build_tiny_model(tmp, shape=args.shape, seed=args.seed, vocab_size=args.vocab_size, dtype=args.dtype)
    try:
        tmp.rename(path)  # complete or absent: a killed build never leaves a half-written model here
    except OSError:  # another call built it meanwhile (or another filesystem): use the fresh copy
        path = tmp
    log(f"built a random {args.shape} model in {time.perf_counter() - start:.1f} s: {path}")
    return str(path)


def int_list(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (argparse type)."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def str_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


# ---------------------------------------------------------------------------- the machine
def machine() -> str:
    """GPU name, or the CPU model with its core count."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor() or platform.machine()
    return f"{name} ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"


def package_version(*names: str) -> str | None:
    """Installed version of the first of ``names`` present (vllm-cpu installs the ``vllm`` module)."""
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def environment(device: str) -> dict[str, Any]:
    """Where the numbers come from: machine, device, library versions, date."""
    import torch

    vllm_dist = "vllm" if package_version("vllm") else "vllm-cpu" if package_version("vllm-cpu") else None
    return {
        "machine": machine(),
        "device": device,
        "torch": torch.__version__,
        "vllm": f"{vllm_dist} {package_version(vllm_dist)}" if vllm_dist else None,
        "transformers": package_version("transformers"),
        "peft": package_version("peft"),
        "python": platform.python_version(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


# ---------------------------------------------------------------------------- timing
def cuda_sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    """(seconds, result) of one call, GPU work included."""
    cuda_sync()
    start = time.perf_counter()
    result = fn()
    cuda_sync()
    return time.perf_counter() - start, result


def warm_median_s(fn: Callable[[], Any], repeats: int) -> float:
    """Median seconds of ``repeats`` timed calls of ``fn``, after one untimed warm-up call (the allocator,
    kernel choices and caches settled)."""
    fn()
    return median([timed(fn)[0] for _ in range(repeats)])


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def gpu_used_bytes() -> int | None:
    """Device-wide used GPU memory (every process: vLLM's engine core runs in its own), None on CPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return int(total - free)


# ---------------------------------------------------------------------------- adapters
def random_adapter_tensors(model_path: str, dtype: str, specs: Sequence[Any], seed: int) -> dict[str, dict]:
    """{adapter: PEFT-format tensors} with random NONZERO lora_A and lora_B (PEFT starts lora_B at 0).

    Shapes come from injecting the adapters into a CPU copy of the base; lora_A ~ N(0, 1/in),
    lora_B ~ N(0, 0.01^2), so a random model's activations stay in range in bf16.
    """
    import torch

    from roll_ma.config.schema import ModelConfig
    from roll_ma.models.adapters import adapter_state_dict, inject_adapters
    from roll_ma.models.loading import load_base_model

    model = inject_adapters(load_base_model(ModelConfig(path=model_path, dtype=dtype), "cpu"), specs, seed)
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for spec in specs:
        state = {}
        for key, value in adapter_state_dict(model, spec.name).items():
            std = value.shape[-1] ** -0.5 if "lora_A" in key else 0.01
            state[key] = (torch.randn(value.shape, generator=gen) * std).to(value.dtype)
        out[spec.name] = state
    del model
    return out


def build_rollout(
    args: argparse.Namespace,
    backend: str,
    num_agents: int,
    micro_batch_size: int = 64,
    max_new_tokens: int = 32,
) -> tuple[Any, list[Any], float]:
    """roll_ma's rollout strategy (hf or vllm) serving ``num_agents`` agents, one adapter each, initialised
    as the pipeline does, then given random nonzero adapters as version 1: (strategy, adapter specs, start s).
    """
    from roll_ma.config.schema import AgentConfig, LoraConfig, ModelConfig, RolloutConfig
    from roll_ma.inference import infer_strategy_class
    from roll_ma.models.adapters import plan_adapters

    lora = LoraConfig(rank=args.lora_rank, alpha=2.0 * args.lora_rank)
    if args.targets:
        lora.target_modules = list(args.targets)
    agents, adapters = plan_adapters(lora, [AgentConfig(name=f"a{i}") for i in range(num_agents)])
    rollout = RolloutConfig(
        backend=backend,
        max_new_tokens=max_new_tokens,
        micro_batch_size=micro_batch_size,
        temperature=1.0,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=max(256, micro_batch_size),
        enforce_eager=args.eager or args.device == "cpu",  # vllm-cpu captures no graphs anyway
    )
    model_cfg = ModelConfig(path=args.model, dtype=args.dtype)
    strategy = infer_strategy_class(backend)(model_cfg, rollout, agents, adapters, args.seed, args.device)
    start_s, _ = timed(strategy.initialize)
    log(f"{backend}: rollout strategy ready in {start_s:.1f} s")
    strategy.update_adapters(random_adapter_tensors(args.model, args.dtype, adapters, args.seed), version=1)
    return strategy, adapters, start_s


def random_prompts(n: int, length: int, low: int, high: int, seed: int) -> list[list[int]]:
    """``n`` prompts of ``length`` random token ids in [low, high) (ids below ``low`` are special tokens)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(low, high, (n, length), generator=gen).tolist()


# ---------------------------------------------------------------------------- output
def markdown_table(columns: Sequence[str], rows: Sequence[dict[str, Any]]) -> str:
    """A markdown table of ``rows`` (dicts) in the order of ``columns``; floats get 4 significant digits."""

    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def report(
    name: str,
    args: argparse.Namespace,
    env: dict[str, Any],
    columns: Sequence[str],
    rows: Sequence[dict[str, Any]],
    summary: dict[str, Any],
    notes: Sequence[str] = (),
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Print the machine, the table, notes and the JSON summary line; save everything to ``--out``."""
    result = {
        "benchmark": name,
        "environment": env,
        "args": _jsonable(vars(args)),
        "rows": list(rows),
        "summary": summary,
        "notes": list(notes),
        **(extra or {}),
    }
    print(f"\n## {name}\n")
    print(
        f"machine: {env['machine']} | device {env['device']} | torch {env['torch']} | vllm {env['vllm']} "
        f"| transformers {env['transformers']} | {env['date']}\n"
    )
    print(markdown_table(columns, rows))
    for note in notes:
        print(f"\n- {note}", end="")
    print("\n")
    print("JSON " + json.dumps({"benchmark": name, **summary}, default=str), flush=True)
    if args.out:
        write_json(args.out, result)
    return result


def merge_previous(name: str, out: str | None, rows: Sequence[dict], key: Sequence[str]) -> list[dict]:
    """``rows`` added to those an earlier call of benchmark ``name`` saved in ``out`` (same key: replaced),
    so that a benchmark can be run in chunks that each stay within a time limit."""
    old = []
    if out and Path(out).exists():
        data = json.loads(Path(out).read_text())
        old = data.get("rows", []) if data.get("benchmark") == name else []
    merged = {tuple(r.get(k) for k in key): r for r in old}
    merged.update({tuple(r.get(k) for k in key): r for r in rows})
    return list(merged.values())


def write_json(path: str, data: Any) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    tmp.replace(out)


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != "child_out"}


# ---------------------------------------------------------------------------- child processes
def run_child(
    script: str, argv: Sequence[str], timeout_s: float | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Run ``script argv --child-out F`` in a fresh Python; returns the JSON it wrote to F.

    The child's output streams through (engine logs help when something breaks); a child that
    wrote no result raises RuntimeError naming the exit code.
    """
    with tempfile.TemporaryDirectory(prefix="roll_ma_bench_child_") as d:
        out = Path(d) / "result.json"
        cmd = [sys.executable, script, *argv, CHILD_FLAG, str(out)]
        log("child: " + " ".join(cmd[1:]))
        proc = subprocess.Popen(cmd, env={**os.environ, **(env or {})})
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)  # the engine processes it spawned too: they hold the GPU memory
            proc.wait()
            raise RuntimeError(f"benchmark child {' '.join(argv)} ran past {timeout_s} s") from None
        if not out.exists():
            raise RuntimeError(f"benchmark child {' '.join(argv)} failed with exit code {proc.returncode}")
        if proc.returncode != 0:  # it wrote its result first (an engine may fail to shut down): keep it
            log(f"child exited with code {proc.returncode} after writing its result")
        return json.loads(out.read_text())


def kill_tree(pid: int) -> None:
    """Kill process ``pid`` and every process it started (by pid, nothing else)."""
    try:
        import psutil  # a dependency of vLLM and Ray

        root = psutil.Process(pid)
        procs = [*root.children(recursive=True), root]
    except ImportError:
        os.kill(pid, 9)
        return
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
