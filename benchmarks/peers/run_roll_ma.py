"""roll_ma on the side-by-side job: ONE run trains all N agents (one LoRA adapter each on one base), or
with --shared one adapter that every seat uses.

The run is roll_ma's own pipeline (``roll_ma.pipelines.run_training``) on benchmarks/seat_game.py's
SeatGame, configured as the shipped 7B configs are (examples/math/math_selfplay_7b.yaml: vLLM with CUDA
graphs colocated with DeepSpeed, sleep level 1, rows packed without padding through variable-length
flash attention, 8k-token micro-batches without activation checkpointing, the reference = the base with
adapters off, pi_old from the update's own forward). Step times are the wall time between consecutive
step ends (each metrics line's ``wall_time``), as every runner here measures. Prints one ``JSON {...}``
result line (job.emit).

    python benchmarks/peers/run_roll_ma.py --agents 3 --model /path/to/random-qwen2.5-7b --device cuda
    python benchmarks/peers/run_roll_ma.py --agents 3 --model /path/to/tiny --device cpu --smoke
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # job.py; seat_game.py and pipeline_scaling.py

from job import (  # noqa: E402
    Job,
    gpu_identity,
    measure_and_emit,
    parse_runner_args,
    phase_medians,
    runner_parser,
    shrink_for_smoke,
    step_summary_from_ends,
    versions,
)

GRAPH_SIZES = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 256]  # as math_selfplay_7b.yaml
# math_selfplay_7b.yaml's trainer settings: its measured best on one 80 GB GPU (docs/benchmarks.md)
UPDATE_TOKENS = 8192  # per micro-batch, no activation checkpointing (66.5 GB peak at 7B)
SCORE_TOKENS = 32768  # reference log-probs: no activations kept
PHASES = {  # the table's phases -> roll_ma's own timers (metrics.jsonl; pipelines/step_timer.py STAGES)
    "rollout": "timing/rollout",
    "sleep": "timing/sleep",
    "scoring": "timing/reference",
    "old_log_probs": "timing/old_log_probs",
    "advantages": "timing/advantages",
    "update": "timing/update",
    "sync": "timing/sync",
    "record": "timing/record",
    "unaccounted": "timing/unaccounted",
}


# the runner's levers (flags) -> what each adds to the table's settings when on
LEVERS = {
    "lora_bf16": "LoRA branches in bf16 (train.lora_compute_dtype=model)",
    "liger": "liger-kernel RMSNorm, SwiGLU, rotary (model.liger_kernel)",
}


def settings(cuda: bool, levers: dict[str, bool]) -> str:
    """What this runner sets, for the table."""
    if not cuda:
        return "CPU smoke: hf generate, padded rows"
    decoding = (
        "one generate call per turn (env.decode_ahead=false)"
        if levers.get("turnwise")
        else "an episode's turns decoded in one generate call (SeatGame plans its turns: env.decode_ahead)"
    )
    extra = "".join(f"; {text}" for name, text in LEVERS.items() if levers.get(name))
    return (
        f"vLLM colocated, CUDA graphs, sleep level 1; {decoding}; DeepSpeed ZeRO-0 bf16; "
        f"packed rows (varlen flash attention); {UPDATE_TOKENS}-token micro-batches, no activation "
        "checkpointing; reference = base "
        "with adapters off; pi_old from the update's own forward (no old-log-prob pass)" + extra
    )


def run_config(
    job: Job,
    n_agents: int,
    model: str,
    device: str,
    out_dir: str,
    shared: bool = False,
    turnwise: bool = False,
    lora_bf16: bool = False,
    liger: bool = False,
) -> Any:
    """The validated RunConfig of the job with N agents (``shared``: one adapter all seats use;
    ``turnwise``: one generate call per turn, not the episode's planned turns at once; ``lora_bf16``:
    train.lora_compute_dtype=model; ``liger``: model.liger_kernel)."""
    from roll_ma.config import ConfigError, RunConfig, to_dataclass
    from roll_ma.preflight.validate import validate

    cuda = device == "cuda"
    e = job.episodes
    rollout: dict[str, Any] = {
        "backend": "vllm" if cuda else "hf",
        "max_new_tokens": job.generation.max_new_tokens,
        "temperature": job.generation.temperature,
        "micro_batch_size": 64,
        "enforce_eager": not cuda,
    }
    if cuda:
        rollout.update(
            per_row_seeds=False,
            gpu_memory_utilization=job.gpu.rollout_memory_fraction,
            sleep_level=1 if job.gpu.sleep_rollout else 0,
            engine_kwargs={"compilation_config": {"cudagraph_capture_sizes": GRAPH_SIZES}},
        )
    train: dict[str, Any] = {
        "lr": job.train.lr,
        "zero_stage": 0,
        "micro_batch_size": job.train.micro_batch_rows,
    }
    if cuda:  # the shipped 7B config's way; the CPU smoke keeps padded rows
        train.update(
            max_tokens_per_micro_batch=UPDATE_TOKENS,
            score_max_tokens_per_micro_batch=SCORE_TOKENS,
            remove_padding=True,
        )
    if lora_bf16:
        train["lora_compute_dtype"] = "model"
    g = job.grpo
    raw = {
        "name": f"peers_roll_ma_{n_agents}agents",
        "seed": job.seed,
        "model": {
            "path": model,
            "dtype": job.dtype,
            "max_prompt_tokens": job.prompt.max_prompt_tokens,
            "gradient_checkpointing": False,  # as math_selfplay_7b: 8k-token micro-batches fit without it
            "liger_kernel": liger,
        },
        "lora": {
            "rank": job.lora.rank,
            "alpha": job.lora.alpha,
            "dropout": job.lora.dropout,
            "target_modules": list(job.lora.target_modules),
        },
        "agents": [
            {"name": f"agent{i}", **({"adapter": "shared"} if shared else {})} for i in range(n_agents)
        ],
        "env": {
            "name": "seat_game:SeatGame",
            "kwargs": {"players": n_agents, "turns": e.turns, "prompt_words": job.prompt.filler_words},
            "groups_per_step": e.groups_per_step,
            "group_size": e.group_size,
            "max_turns": e.turns,
            "num_workers": 1,
            "decode_ahead": not turnwise,
        },
        "rollout": rollout,
        "train": train,
        "reference": {"mode": "train_worker" if g.kl_coef > 0 else "none"},
        "algorithm": {
            "advantage": "grpo",
            "gamma": 0.0,  # a turn's advantage from its own reply only, as the single-turn peers score it
            "norm_std": g.norm_std,
            "clip_ratio_low": g.clip_low,
            "clip_ratio_high": g.clip_high,
            "kl_coef": g.kl_coef,
            "kl_estimator": g.kl_estimator,
            "kl_mode": "loss",
            "loss_agg": g.loss_agg,
        },
        "trainer": {
            "max_steps": job.steps,
            "output_dir": out_dir,
            "resume": "never",
            "progress_bars": False,
            "eval_every": 0,
            "save_every": 0,
        },
        "resources": {"num_gpus": 1 if cuda else 0},
    }
    cfg, problems = to_dataclass(RunConfig, raw)
    problems += validate(cfg, check_env=True)
    if problems:
        raise ConfigError(problems)
    return cfg


def measure(
    job: Job, n_agents: int, model: str, device: str, shared: bool, levers: dict[str, bool]
) -> dict[str, Any]:
    """Run the pipeline and read its metrics: step ends, its own phase timers, tokens, the GPU memory."""
    from pipeline_scaling import summarize_run

    from roll_ma.distributed.ray_env import init_ray, shutdown_ray
    from roll_ma.pipelines import run_training
    from roll_ma.tracking import read_metrics

    started = time.time()  # on the metrics' wall_time clock: the start-up counts from here, Ray included
    # SeatGame is imported by path in every Ray actor: they must find benchmarks/
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(HERE.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    init_ray(env_vars={"PYTHONPATH": os.environ["PYTHONPATH"]})
    try:
        with tempfile.TemporaryDirectory(prefix="peers_roll_ma_") as out_dir:
            run_training(run_config(job, n_agents, model, device, out_dir, shared, **levers))
            metrics = read_metrics(Path(out_dir) / "metrics.jsonl")
    finally:
        shutdown_ray()
    steps = step_summary_from_ends([m["wall_time"] for m in metrics], job.warmup_steps, started_at=started)
    timed = metrics[job.warmup_steps :]
    tokens = sorted(m.get("rollout/response_tokens", 0.0) for m in timed)
    rows = sorted(m.get("rollout/turns", 0.0) for m in timed)
    parts = summarize_run(metrics, n_agents)
    return {
        **steps,
        "own_step_s": parts.get("step_s"),  # roll_ma's own timer of the step, beside the common clock
        "phases_s": phase_medians(metrics, PHASES, job.warmup_steps),
        # roll_ma's own start-up stages (model loads, engine start, first sync), in step 1's line
        "startup_s": {
            key.split("/", 1)[1]: round(seconds, 2)
            for key, seconds in (metrics[0] if metrics else {}).items() if key.startswith("startup/")
        },
        "rows_per_step": rows[len(rows) // 2] if rows else None,
        "response_tokens_per_step": tokens[len(tokens) // 2] if tokens else None,
        "framework_peak_gb": parts.get("gpu_peak_gb"),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = runner_parser(__doc__, one_agent=False)
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    p.add_argument(
        "--smoke", action="store_true", help="the job shrunk to a CPU-sized check (job.shrink_for_smoke)"
    )
    p.add_argument(
        "--turnwise", action="store_true", help="one generate call per turn (env.decode_ahead=false)"
    )
    p.add_argument(
        "--lora-bf16", action="store_true", help="LoRA in the model's bf16 (train.lora_compute_dtype=model)"
    )
    p.add_argument("--liger", action="store_true", help="liger-kernel's fused kernels (model.liger_kernel)")
    args, job = parse_runner_args(p, argv)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    job = shrink_for_smoke(job) if args.smoke else job
    levers = {"turnwise": args.turnwise, "lora_bf16": args.lora_bf16, "liger": args.liger}
    result: dict[str, Any] = {
        "framework": "roll_ma",
        "agents": args.agents,
        "agent": None,  # all agents in this run
        "shared": args.shared,
        "rows_per_step_planned": job.rows_per_step(1),
        "settings": settings(args.device == "cuda", levers),
        "passes": "generation; reference (adapters off); update (pi_old from its own forward)",
        "versions": versions("torch", "transformers", "peft", "vllm", "deepspeed", "ray", "liger-kernel"),
        **(gpu_identity() if args.device == "cuda" else {}),
    }
    return measure_and_emit(
        result, lambda: measure(job, args.agents, args.model, args.device, args.shared, levers)
    )


if __name__ == "__main__":
    main()
