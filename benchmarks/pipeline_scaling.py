"""Pipeline scaling: step time and its parts as the number of agents and the batch grow, by running the
real pipeline; GPU memory; the pipeline's rollout rate against the bare engine on the same calls; and
the memory of N agents as adapters on one base against N separate models.

    python benchmarks/pipeline_scaling.py                                  # CPU, hf, tiny model, ~2 min
    # GPU, the real-scale sweep (random Qwen2.5-7B-shaped weights, vLLM with CUDA graphs colocated with
    # DeepSpeed; each agent count is one pipeline run, ~3 min); chunks append to the same --out:
    python benchmarks/pipeline_scaling.py --device cuda --shape qwen2.5-7b --agents 1,2 --batches 64 \
        --turns 2 --new-tokens 256 --replay --skip-memory --out ps.json --plot ps.png
    python benchmarks/pipeline_scaling.py --device cuda --shape qwen2.5-7b --agents 4,8 --batches 64 \
        --turns 2 --new-tokens 256 --replay --skip-memory --out ps.json --plot ps.png

Throughput vs GPUs at fixed per-GPU work (``--gpus``): each GPU count G runs G rollout engines and G
train ranks, every role colocated on every GPU, on G x ``--batches[0]`` episodes per step, for each of
``--agents``; the table adds episodes/s, tokens/s and the efficiency against 1 GPU, ``--plot`` draws
throughput vs GPUs (``throughput.py``). On cpu the same runs use G workers of each role and no GPU.

    python benchmarks/pipeline_scaling.py --device cuda --model M --agents 8 --gpus 1,2,4,8 --batches 64 \
        --turns 2 --new-tokens 256 --skip-memory --out scaling.json --plot scaling.png

Every run is ``roll_ma.pipelines.run_training`` on a config built here (nothing else is mocked): the
env is ``seat_game.SeatGame``, an N-seat game where every seat is its own agent (own LoRA adapter) and
an episode is ``--turns`` turns. The turns per episode stay the same as N grows, so every run trains
on the same rows and tokens; only how they split over agents changes. ``--agents`` sweeps N at the
first of ``--batches``; the other batch sizes (episodes per step) run at ``--batch-agents`` agents.
Numbers are medians of ``timing/*`` in metrics.jsonl over the steps after the first.

On GPU the run is configured as the shipped 7B configs are (gradient checkpointing, token-budget
micro-batches, chunked LM head, in-memory adapter sync, no per-row seeds) and the engine keeps the
same LoRA slots for every agent count (``max_loras=8``), so that only the agents differ between runs
(and vLLM's compile cache serves every run after the first). ``--replay`` records the last step's
generate calls and replays them bare on the engine (``roll_ma.inference.engine_replay``).

Memory (weights only, no optimizer state): N adapters on one base against N copies of the base,
from parameter counts, and on GPU measured as ``torch.cuda.max_memory_allocated`` while loading
the base + N PeftModel adapters vs N copies of the base (in a child process).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GRAPH_SIZES = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 256]  # CUDA graphs captured (engine start)


# ---------------------------------------------------------------------------- arguments
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from common import base_parser, int_list, str_list

    p = base_parser(__doc__)
    p.add_argument(
        "--backend", default=None, choices=["hf", "vllm"], help="rollout (default: hf cpu, vllm cuda)"
    )
    p.add_argument(
        "--agents", type=int_list, default=None, help="agent counts (default: 1,2,4 cpu; 1,2,4,8 cuda)"
    )
    p.add_argument(
        "--batches", type=int_list, default=None, help="episodes per step (default: 4,8 cpu; 64 cuda)"
    )
    p.add_argument("--batch-agents", type=int, default=2, help="agents of the batch sweep")
    p.add_argument(
        "--gpus",
        type=int_list,
        default=None,
        help="GPU counts of a throughput sweep at fixed per-GPU work (--batches[0] episodes per GPU); "
        "replaces the agent and batch sweeps",
    )
    p.add_argument("--turns", type=int, default=None, help="turns per episode (default: 4 cpu, 2 cuda)")
    p.add_argument("--group-size", type=int, default=4, help="episodes per GRPO group")
    p.add_argument("--steps", type=int, default=3, help="pipeline steps per run (the first is not counted)")
    p.add_argument("--new-tokens", type=int, default=None, help="max new tokens (default: 8 cpu, 256 cuda)")
    p.add_argument("--prompt-words", type=int, default=None, help="filler words per prompt (16 cpu, 64 cuda)")
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument(
        "--targets",
        type=str_list,
        default=None,
        help="LoRA target modules (default: all linear on cpu, q,k,v,o on cuda as the 7B configs)",
    )
    p.add_argument("--cuda-graphs", dest="eager", action="store_false", help="vLLM with CUDA graphs")
    p.add_argument("--eager", dest="eager", action="store_true", help="vLLM without CUDA graphs")
    p.set_defaults(eager=None)
    p.add_argument("--sleep-level", type=int, default=1, help="vLLM sleep level while training (0: awake)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.45, help="vLLM's share of the GPU")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="train.max_tokens_per_micro_batch (default: 16384 cuda, rows on cpu)",
    )
    p.add_argument("--kl-coef", type=float, default=0.0, help="> 0: reference log-probs (adapters off) too")
    p.add_argument("--replay", action="store_true", help="replay the last step's generate calls bare (vllm)")
    p.add_argument("--plot", default=None, help="write the stacked step parts vs agents here (png)")
    p.add_argument(
        "--timeline", default=None, help="write the rollout / trainer timeline of each run here (png)"
    )
    p.add_argument("--split", action="store_true", help="cuda: rollout on GPU 1, train on GPU 0 (2 GPUs)")
    p.add_argument(
        "--max-staleness",
        type=int,
        default=0,
        help="rollout.max_staleness (>= 1: the asynchronous loop; on a colocated GPU add --sleep-level 0)",
    )
    p.add_argument("--skip-memory", action="store_true", help="skip the memory comparison")
    p.add_argument(
        "--memory-agents",
        type=int_list,
        default=None,
        help="agent counts of the memory comparison (default: 1,2,4,8 cuda; --agents cpu)",
    )
    p.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    args.backend = args.backend or ("vllm" if cuda else "hf")
    args.agents = args.agents or ([1, 2, 4, 8] if cuda else [1, 2, 4])
    args.memory_agents = args.memory_agents or ([1, 2, 4, 8] if cuda else args.agents)
    args.batches = args.batches or ([64] if cuda else [4, 8])
    args.turns = args.turns or (2 if cuda else 4)
    args.new_tokens = args.new_tokens or (256 if cuda else 8)
    args.prompt_words = args.prompt_words if args.prompt_words is not None else (64 if cuda else 16)
    args.eager = (not cuda) if args.eager is None else args.eager
    args.max_tokens = args.max_tokens if args.max_tokens is not None else (16384 if cuda else None)
    args.targets = args.targets or (["q_proj", "k_proj", "v_proj", "o_proj"] if cuda else None)
    bad = [b for b in args.batches if b % args.group_size]
    if bad:
        p.error(f"--batches {bad} must be multiples of --group-size {args.group_size}")
    if args.steps < 2:
        p.error("--steps must be >= 2 (the first step is warm-up)")
    if args.replay and args.backend != "vllm":
        p.error("--replay needs --backend vllm (it replays calls on the vLLM engine)")
    if args.gpus and (min(args.gpus) < 1 or 1 not in args.gpus and not args.out):
        p.error(
            "--gpus needs counts >= 1 and 1 among them (the efficiency's base), or an --out that a "
            "1-GPU run already wrote to"
        )
    return args


def planned_runs(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(agents, episodes per step) of every run: the agent sweep, then the batch sweep."""
    runs = [(n, args.batches[0]) for n in args.agents] + [(args.batch_agents, b) for b in args.batches[1:]]
    return list(dict.fromkeys(runs))


# ---------------------------------------------------------------------------- one pipeline run
def run_config(args: argparse.Namespace, agents: int, batch: int, out_dir: str, gpus: int = 1) -> Any:
    """The typed, validated RunConfig of one run (``gpus``: engines, train ranks and env workers)."""
    from roll_ma.config import ConfigError, RunConfig, to_dataclass
    from roll_ma.preflight.validate import validate

    cuda = args.device == "cuda"
    lora: dict[str, Any] = {"rank": args.lora_rank, "alpha": 2.0 * args.lora_rank}
    if args.targets:
        lora["target_modules"] = list(args.targets)
    rollout: dict[str, Any] = {
        "max_staleness": args.max_staleness,
        "backend": args.backend,
        "max_new_tokens": args.new_tokens,
        "temperature": 1.0,
        "micro_batch_size": 64,
        "enforce_eager": args.eager,
    }
    train: dict[str, Any] = {"lr": 1e-4, "micro_batch_size": 32, "zero_stage": 0}
    if args.max_tokens:
        train.update(
            max_tokens_per_micro_batch=args.max_tokens, score_max_tokens_per_micro_batch=2 * args.max_tokens
        )
    if cuda:
        rollout.update(
            per_row_seeds=False,
            gpu_memory_utilization=args.gpu_memory_utilization,
            sleep_level=args.sleep_level,
            # the same slots for every agent count: only the agents differ, and the compile cache is reused
            engine_kwargs={
                "max_loras": max(8, agents),
                "max_cpu_loras": 2 * max(8, agents),
                **({} if args.eager else {"compilation_config": {"cudagraph_capture_sizes": GRAPH_SIZES}}),
            },
        )
    raw = {
        "name": f"scaling_{agents}agents_{batch}episodes",
        "seed": args.seed,
        "model": {
            "path": args.model,
            "dtype": args.dtype,
            "max_prompt_tokens": 512,
            "gradient_checkpointing": cuda,
        },
        "lora": lora,
        "agents": [{"name": f"agent{i}"} for i in range(agents)],
        "env": {
            "name": "seat_game:SeatGame",
            "kwargs": {"players": agents, "turns": args.turns, "prompt_words": args.prompt_words},
            "groups_per_step": batch // args.group_size,
            "group_size": args.group_size,
            "max_turns": args.turns,
            "num_workers": gpus,
        },
        "rollout": {**rollout, "num_workers": gpus},
        "train": {**train, "num_workers": gpus},
        "reference": {"mode": "train_worker" if args.kl_coef > 0 else "none"},
        "algorithm": {"kl_coef": args.kl_coef},
        "trainer": {
            "max_steps": args.steps,
            "output_dir": out_dir,
            "resume": "never",
            "progress_bars": False,
        },
        # default mapping: every role on GPUs 0..gpus-1; --split: rollout and train on a GPU each
        "resources": (
            {"num_gpus": 2, "device_mapping": {"rollout": [1], "train": [0]}}
            if cuda and args.split
            else {"num_gpus": gpus if cuda else 0}
        ),
    }
    cfg, problems = to_dataclass(RunConfig, raw)
    problems += validate(cfg, check_env=True)
    if problems:
        raise ConfigError(problems)
    return cfg


def summarize_run(metrics: list[dict[str, Any]], agents: int) -> dict[str, Any]:
    """Medians over the steps after the first of the timing/* metrics (and what they derive)."""
    from common import median

    steps = metrics[1:]

    def med(key: str) -> float | None:
        vals = [m[key] for m in steps if key in m]
        return median(vals) if vals else None

    def peak(key: str) -> float | None:
        vals = [m[key] for m in metrics if key in m]
        return max(vals) if vals else None

    per_adapter = [v for m in steps for k, v in m.items() if k.startswith("timing/sync/")]
    per_update = [v for m in steps for k, v in m.items() if k.startswith("timing/update/")]
    out = {
        "step_s": med("timing/step"),
        "rollout_s": med("timing/rollout"),
        "reference_s": med("timing/reference"),
        "old_log_probs_s": med("timing/old_log_probs"),
        "update_s": med("timing/update"),
        "update_adapter_s": median(per_update) if per_update else None,  # one adapter's own update
        "sync_s": med("timing/sync"),
        "sync_wake_s": med("timing/sync_wake"),
        "sync_export_s": med("timing/sync_export"),  # train worker -> object store
        "sync_install_s": med("timing/sync_install"),  # object store -> engines, all adapters installed
        "sync_per_adapter_ms": 1e3 * med("timing/sync_per_adapter")
        if med("timing/sync_per_adapter")
        else None,
        "sync_adapter_ms": 1e3 * median(per_adapter) if per_adapter else None,  # the engine's own install
        # the sync's profile: the trainer's packing, rank 0's rollout worker, its call into vLLM, the engine
        "sync_export_pack_ms": 1e3 * med("timing/sync_export_pack")
        if med("timing/sync_export_pack")
        else None,
        "sync_install_worker_ms": (
            1e3 * med("timing/sync_install_worker") if med("timing/sync_install_worker") else None
        ),
        "sync_install_rpc_ms": 1e3 * med("timing/sync_install_rpc")
        if med("timing/sync_install_rpc")
        else None,
        "sync_engine_sum_ms": (
            1e3 * median([sum(v for k, v in m.items() if k.startswith("timing/sync/")) for m in steps])
            if per_adapter
            else None
        ),
        "rows": med("rollout/turns"),
        "response_tokens": med("rollout/response_tokens"),
        "rollout_tok_s": med("system/rollout_tokens_per_s"),
        "gpu_rollout_gb": peak("system/gpu_used_gb_rollout"),
        "gpu_update_gb": peak("system/gpu_peak_gb_update"),
        "train_peak_gb": peak("system/train_gpu_peak_gb"),
    }
    gpu = [v for v in (out["gpu_rollout_gb"], out["gpu_update_gb"]) if v is not None]
    out["gpu_peak_gb"] = max(gpu) if gpu else None
    out["update_agent_s"] = out["update_s"] / agents if out["update_s"] is not None else None
    if out["step_s"] is not None:
        counted = ("rollout_s", "reference_s", "old_log_probs_s", "update_s", "sync_s")
        out["other_s"] = out["step_s"] - sum(out[k] or 0.0 for k in counted)
    replay = [m for m in metrics if "replay/engine_tok_s" in m]
    if replay:
        last = replay[-1]
        out.update({k.removeprefix("replay/"): v for k, v in last.items() if k.startswith("replay/")})
        out["rollout_vs_engine"] = last["system/rollout_tokens_per_s"] / last["replay/engine_tok_s"]
    return out


def replay_hook(args: argparse.Namespace):
    """A step hook that records the generate calls of the last step's rollout and replays them bare."""

    def hook(workers: Any, step: int) -> dict[str, float] | None:
        if step == args.steps - 1:
            workers.rollout.record_generate_calls(True)  # the next step's rollout is recorded
        if step == args.steps:
            return {f"replay/{k}": v for k, v in workers.rollout.replay_generate_calls().items()}
        return None

    return hook if args.replay else None


def timeline_of(metrics: list[dict[str, Any]]) -> list[dict[str, float]]:
    """Per step, the wall-clock intervals of the rollout (env workers) and of the update + sync (the
    trainer), in seconds from the first rollout's start."""
    keys = ("rollout_start", "rollout_end", "score_start", "update_start", "update_end", "sync_end")
    steps = [m for m in metrics if all(f"timeline/{k}" in m for k in keys)]
    if not steps:
        return []
    t0 = min(m["timeline/rollout_start"] for m in steps)
    return [{"step": m["step"], **{k: m[f"timeline/{k}"] - t0 for k in keys}} for m in steps]


def run_one(args: argparse.Namespace, agents: int, batch: int, gpus: int = 1) -> dict[str, Any]:
    from common import log

    from roll_ma.pipelines import run_training
    from roll_ma.tracking import read_metrics

    with tempfile.TemporaryDirectory(prefix="roll_ma_scaling_") as out_dir:
        cfg = run_config(args, agents, batch, out_dir, gpus)
        start = time.perf_counter()
        run_training(cfg, step_hook=replay_hook(args))
        wall = time.perf_counter() - start
        metrics = read_metrics(Path(out_dir) / "metrics.jsonl")
    res = {
        "agents": agents,
        "episodes": batch,
        "gpus": gpus,
        "max_staleness": args.max_staleness,
        **summarize_run(metrics, agents),
        "run_wall_s": wall,
        "timeline": timeline_of(metrics),
    }
    log(
        f"{agents} agents, {batch} episodes/step, {gpus} GPU(s): step {res['step_s']:.3f} s "
        f"(run {wall:.0f} s)"
    )
    return res


# ---------------------------------------------------------------------------- the sweeps
COLUMNS = [
    "agents",
    "episodes",
    "max_staleness",
    "rows",
    "step_s",
    "rollout_s",
    "reference_s",
    "old_log_probs_s",
    "update_s",
    "update_adapter_s",
    "sync_s",
    "sync_wake_s",
    "sync_export_s",
    "sync_install_s",
    "sync_per_adapter_ms",
    "sync_export_pack_ms",
    "sync_install_worker_ms",
    "sync_install_rpc_ms",
    "sync_engine_sum_ms",
    "sync_adapter_ms",
    "other_s",
    "step_vs_fewest_agents",
    "gpu_peak_gb",
    "gpu_vs_fewest_agents",
    "rollout_tok_s",
    "engine_tok_s",
    "engine_logprobs_tok_s",
    "rollout_vs_engine",
    "run_wall_s",
]
GPU_COLUMNS = ["episodes_per_s", "tokens_per_s", "speedup", "efficiency"]  # the --gpus sweep's


def run_sweep(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every planned run (merged with those ``--out`` already holds) and the JSON summary."""
    from common import merge_previous
    from throughput import add_throughput, planned_gpu_runs

    if args.gpus:
        plan = planned_gpu_runs(args.agents, args.batches[0], args.gpus)
        key: tuple[str, ...] = ("agents", "episodes", "gpus", "max_staleness")
    else:
        plan = [(n, batch, 1) for n, batch in planned_runs(args)]
        key = ("agents", "episodes", "max_staleness")
    new = [run_one(args, n, batch, gpus) for n, batch, gpus in plan]
    runs = merge_previous("pipeline_scaling", args.out, new, key)

    def kind(r: dict[str, Any]) -> tuple:  # runs compared with each other: same batch, GPUs and staleness
        return r["episodes"], r.get("gpus", 1), r.get("max_staleness", 0)

    rows = sorted(
        runs, key=lambda r: (r.get("gpus", 1), r.get("max_staleness", 0), r["episodes"], r["agents"])
    )
    for r in rows:  # relative to the fewest agents of the same kind
        same = [b for b in rows if kind(b) == kind(r)]
        ref = min(same, key=lambda b: b["agents"])
        r["step_vs_fewest_agents"] = r["step_s"] / ref["step_s"]
        if r.get("gpu_peak_gb") and ref.get("gpu_peak_gb"):
            r["gpu_vs_fewest_agents"] = r["gpu_peak_gb"] / ref["gpu_peak_gb"]
    if not args.gpus:
        return rows, {f"step_s_{r['agents']}agents_{r['episodes']}ep": round(r["step_s"], 4) for r in rows}
    add_throughput(rows)
    summary = {}
    for r in rows:
        tag = f"{r['agents']}agents_{r['gpus']}gpus"
        summary[f"episodes_per_s_{tag}"] = round(r["episodes_per_s"], 4)
        if r.get("efficiency") is not None:
            summary[f"efficiency_{tag}"] = round(r["efficiency"], 4)
    return rows, summary


# ---------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict[str, Any]:
    # SeatGame is imported by import path in every Ray actor: they must find this folder
    here = str(Path(__file__).resolve().parent)
    sys.path.insert(0, here)
    os.environ["PYTHONPATH"] = os.pathsep.join([here, *filter(None, [os.environ.get("PYTHONPATH")])])
    from common import environment, markdown_table, prepare_model, report, setup_device
    from scaling_memory import measure_memory_child, memory_rows
    from scaling_plots import plot_parts, plot_timeline

    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    setup_device(args)
    if args.memory_child:
        measure_memory_child(args)
        return {}
    if args.child_out:
        raise SystemExit("pipeline_scaling: --child-out is only for the memory child (--memory-child)")
    model_label = args.model or f"random {args.shape}"
    args.model = prepare_model(args)
    previous = json.loads(Path(args.out).read_text()) if args.out and Path(args.out).exists() else {}
    previous = previous if previous.get("benchmark") == "pipeline_scaling" else {}

    mem = previous.get("memory", []) if args.skip_memory else memory_rows(args)
    from roll_ma.distributed.ray_env import init_ray

    init_ray(env_vars={"PYTHONPATH": os.environ["PYTHONPATH"]})
    rows, summary = run_sweep(args)
    engine = f" ({'eager' if args.eager else 'CUDA graphs'})" if args.backend == "vllm" else ""
    setting = (
        f"model {model_label}, {args.dtype}, rollout {args.backend}{engine}, LoRA rank {args.lora_rank} on "
        f"{','.join(args.targets) if args.targets else 'all linear layers'}; {args.turns} turns per episode, "
        f"<= {args.new_tokens} new tokens, {args.steps} steps per run (median over steps 2..{args.steps})"
    )
    if args.plot and args.gpus:
        from throughput import plot_throughput

        plot_throughput(rows, args.plot, setting)
    elif args.plot:
        plot_parts([r for r in rows if r.get("max_staleness", 0) == args.max_staleness], args.plot, setting)
    if args.timeline:
        plot_timeline(rows, args.timeline, setting)
    mem_cols = list(mem[0]) if mem else []
    notes = [
        setting,
        "update_adapter = one adapter's own update; other = step - (rollout + reference + old_log_probs"
        " + update + sync); sync = wake-up + export (train worker -> object store) + install (-> every "
        "engine); sync_per_adapter = (export + install) / adapters synced; sync_adapter_ms = the "
        "engine's own install",
        "gpu_peak_gb = max(whole GPU with the engine awake at the end of the rollout, whole GPU at the "
        "trainer's peak); rollout_vs_engine = the pipeline's rollout tok/s over the bare engine's on the "
        "same calls (--replay)",
        "memory (weights only):\n\n" + (markdown_table(mem_cols, mem) if mem else "skipped"),
    ]
    if args.gpus:
        where = "GPUs 0..G-1" if args.device == "cuda" else "the CPU: G workers of each role, no GPU"
        notes.insert(
            1,
            (
                f"gpus = G: G rollout engines and G train ranks, every role colocated on {where}; G env "
                f"workers; {args.batches[0]} episodes per GPU per step. episodes_per_s = episodes / step_s; "
                "tokens_per_s = response tokens / step_s; efficiency = episodes_per_s / (G x episodes_per_s "
                "at 1 GPU)"
            ),
        )
    columns = ["gpus", *COLUMNS[:2], *GPU_COLUMNS, *COLUMNS[2:]] if args.gpus else COLUMNS
    return report(
        "pipeline_scaling",
        args,
        environment(args.device),
        columns,
        rows,
        summary,
        notes,
        extra={"memory": mem},
    )


if __name__ == "__main__":
    main()
