r"""roll_ma on the side-by-side job: ONE run trains all N agents (one LoRA adapter each on one base), or
(a row with ``adapters: shared``) one adapter that every seat uses, the seat named in the prompt.

The run is roll_ma's own pipeline (``roll_ma.pipelines.run_training``) on benchmarks/seat_game.py's
SeatGame (vLLM colocated with DeepSpeed on one GPU, the reference = the base with adapters off, pi_old
from the update's own forward), at the settings of one of the job's roll_ma rows (``--row``, default
``roll_ma``: its defaults as examples/math/math_selfplay_7b.yaml ships them). This runner keeps no setting
of its own: every one comes from job.yaml. Step times are the wall time between consecutive
step ends (each metrics line's ``wall_time``), as every runner here measures. Prints one ``JSON {...}``
result line (job.emit).

    python benchmarks/peers/run_roll_ma.py --agents 3 --model /path/to/random-qwen2.5-7b --device cuda
    python benchmarks/peers/run_roll_ma.py --agents 3 --model M --row roll_ma_unfused \
        --job benchmarks/peers/relay.yaml
    python benchmarks/peers/run_roll_ma.py --agents 3 --model /path/to/tiny --device cpu --smoke

The run writes into a temporary folder, removed when it ends, and its lines do not name that folder (they
say ``<temporary folder>``, and a line before them says why); ``--out-dir DIR`` keeps the run's folder
(checkpoints, metrics, logs) there.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]  # job.py; seat_game.py and pipeline_scaling.py

from job import (  # noqa: E402
    KV_CACHE_ONLY,
    Job,
    Row,
    exit_code,
    gpu_identity,
    measure_and_emit,
    parse_runner_args,
    phase_medians,
    refuse_update_rows,
    rows_of_run,
    runner_parser,
    shrink_for_smoke,
    step_summary_from_ends,
    versions,
)

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

SYNC_PARTS = {  # the sync phase's own parts (roll_ma's timers; pipelines/rl/adapter_sync.py): its profile
    "wake": "timing/sync_wake",  # the engine's wake-up after sleeping (sleep_level 1)
    "export": "timing/sync_export",  # packing the changed adapters + the hand-over (driver's wall)
    "export_pack": "timing/sync_export_pack",  # the train worker's own part of the export
    "install": "timing/sync_install",  # every engine installed them (driver's wall)
    "install_rpc": "timing/sync_install_rpc",  # rank 0's call into vLLM's worker
    "per_adapter": "timing/sync_per_adapter",  # export + install over the adapters pushed
}
MFU_PASSES = {  # the trainer's passes at model FLOPs utilisation (docs/benchmarks.md's formula; GPU only)
    "reference": "system/mfu/reference",
    "update": "system/mfu/update",
}

# native keys that need a CUDA GPU: the CPU smoke leaves them out (and says so in its settings)
GPU_ONLY = ("rollout.engine_kwargs", "rollout.per_row_seeds")


def settings_text(row: Row, cuda: bool) -> str:
    """The row's settings as the table writes them (the CPU smoke: what it leaves out)."""
    if not cuda:
        return "CPU smoke: hf generate; the row's settings without liger, sleep and vLLM's engine options"
    return f"{row.name}: {row.describe()}"


def _set(raw: dict[str, Any], dotted: str, value: Any) -> None:
    """raw[a][b] = value for the config key ``a.b``."""
    *parents, leaf = dotted.split(".")
    for key in parents:
        raw = raw.setdefault(key, {})
    raw[leaf] = value


def _keys(raw: dict[str, Any], prefix: str = "") -> Any:
    """The dotted config keys of every value ``raw`` sets."""
    for key, value in raw.items():
        if isinstance(value, dict) and value:
            yield from _keys(value, f"{prefix}{key}.")
        else:
            yield prefix + key


def run_config(
    job: Job,
    row: Row,
    n_agents: int,
    model: str,
    device: str,
    out_dir: str,
    shared: bool = False,
) -> Any:
    """The validated RunConfig of the job with N agents at ``row``'s settings (``shared``: one adapter all
    seats use). Every setting comes from the job file: the work from its sections, the trainer's from the
    row (settings in the table's words, native as roll_ma config keys)."""
    from roll_ma.config import ConfigError, RunConfig, to_dataclass
    from roll_ma.preflight.validate import validate

    cuda = device == "cuda"
    s, g, e = row.settings, job.grpo, job.episodes
    turns = job.turns(n_agents)
    raw: dict[str, Any] = {
        "name": f"peers_{row.name}_{n_agents}agents",
        "seed": job.seed,
        "model": {
            "path": model,
            "dtype": job.dtype,
            "max_prompt_tokens": job.prompt.max_prompt_tokens,
            "gradient_checkpointing": s.gradient_checkpointing,
            "liger_kernel": s.liger_kernel and cuda,
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
            "kwargs": {
                "players": n_agents,
                "turns": turns,
                "prompt_words": job.prompt.filler_words,
                "relay_reply_chars": e.relay_reply_chars if e.relay else 0,
            },
            "groups_per_step": job.groups_per_step(n_agents),
            "group_size": e.group_size,
            "max_turns": turns,
            "num_workers": 1,
        },
        "rollout": {
            "backend": "vllm" if cuda else "hf",
            "max_new_tokens": job.generation.max_new_tokens,
            "temperature": job.generation.temperature,
            "enforce_eager": not cuda,
            **(
                {
                    "gpu_memory_utilization": job.gpu.rollout_memory_fraction,
                    "sleep_level": (KV_CACHE_ONLY if s.sleep_rollout == KV_CACHE_ONLY
                                    else 1 if s.sleep_rollout else 0),
                }
                if cuda
                else {}
            ),  # fmt: skip
        },
        "train": {
            "lr": job.train.lr,
            "max_tokens_per_micro_batch": s.update_tokens,
            "score_max_tokens_per_micro_batch": s.scoring_tokens,
            "remove_padding": s.attention == "packed",
        },
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
    set_here = list(_keys(raw))
    taken = sorted(k for k in row.native if any(d == k or d.startswith(k + ".") for d in set_here))
    if taken:  # one source for each setting: the job's work or the row's settings, not both
        raise ValueError(f"{job.source}: rows.{row.name}.native sets {', '.join(taken)}, which the job sets")
    for key, value in row.native.items():
        if cuda or key not in GPU_ONLY:
            _set(raw, key, value)
    cfg, problems = to_dataclass(RunConfig, raw)
    problems += validate(cfg, check_env=True)
    if problems:
        raise ConfigError(problems)
    return cfg


def check_row(job: Job, row: Row, n_agents: int) -> None:
    """Refuse, before Ray starts, a row roll_ma cannot run, naming its key: a native key that is no roll_ma
    config key or has a value of the wrong type (the config's own check), ``settings.update_rows``
    (roll_ma's micro-batches are token budgets: update_tokens)."""
    from roll_ma.config import RunConfig, to_dataclass

    where = f"{job.source}: rows.{row.name}"
    refuse_update_rows(job, row, "roll_ma's micro-batches are token budgets (settings.update_tokens)")
    raw: dict[str, Any] = {}
    for key, value in row.native.items():
        _set(raw, key, value)
    _, problems = to_dataclass(RunConfig, raw)
    if problems:
        raise ValueError(f"{where}.native: " + "; ".join(str(p) for p in problems))


TEMPORARY = "<temporary folder>"


class _Unnamed:
    """A text stream that writes ``folder`` as ``TEMPORARY``: the run's lines (its header, each checkpoint,
    its last line) would otherwise name a folder that is gone when the runner exits."""

    def __init__(self, stream: TextIO, folder: str):
        self.stream, self.folder = stream, folder

    def write(self, text: str) -> int:
        self.stream.write(text.replace(self.folder, TEMPORARY))
        return len(text)

    def __getattr__(self, name: str) -> Any:  # flush, isatty, fileno, encoding, ...
        return getattr(self.stream, name)


@contextlib.contextmanager
def run_folder(keep: str | None) -> Iterator[str]:
    """The run's output folder: ``keep`` (--out-dir), kept; else a temporary one, removed at the end and
    never named in what the run prints."""
    if keep:
        yield str(Path(keep).resolve())
        return
    with tempfile.TemporaryDirectory(prefix="peers_roll_ma_") as out_dir:
        print(
            f"[roll_ma] the run's folder is temporary, removed at its end ({TEMPORARY} below); "
            "--out-dir DIR keeps it",
            flush=True,
        )
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Unnamed(saved[0], out_dir), _Unnamed(saved[1], out_dir)
        try:
            yield out_dir
        finally:
            sys.stdout, sys.stderr = saved


def measure(
    job: Job, row: Row, n_agents: int, model: str, device: str, shared: bool, keep: str | None = None
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
        with run_folder(keep) as out_dir:
            run_training(run_config(job, row, n_agents, model, device, out_dir, shared))
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
        "sync_parts_s": phase_medians(metrics, SYNC_PARTS, job.warmup_steps),
        "mfu": phase_medians(metrics, MFU_PASSES, job.warmup_steps),
        # roll_ma's own start-up stages (model loads, engine start, first sync), in step 1's line
        "startup_s": {
            key.split("/", 1)[1]: round(seconds, 2)
            for key, seconds in (metrics[0] if metrics else {}).items()
            if key.startswith("startup/")
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
        "--out-dir",
        help="keep the run's folder (checkpoints, metrics.jsonl, logs) here; default: a temporary folder, "
        "removed at the end",
    )
    args, job, row = parse_runner_args(p, argv, "roll_ma", check_row)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    job = shrink_for_smoke(job, args.agents) if args.smoke else job
    decoding = (
        "each turn decoded when its prompt is known (relay: prompts carry the replies)"
        if job.episodes.relay or not row.native.get("env.decode_ahead", True)
        else "an episode's planned turns decoded in one generate call (env.decode_ahead)"
    )
    result: dict[str, Any] = {
        "framework": "roll_ma",
        "row": row.name,
        "agents": args.agents,
        "agent": None,  # all agents in this run
        "shared": args.shared,
        "relay": job.episodes.relay,
        "rows_per_step_planned": rows_of_run(job, args.agents, None),
        "settings": settings_text(row, args.device == "cuda"),
        "passes": f"generation ({decoding}); reference (adapters off); update (pi_old from its own forward)",
        "versions": versions("torch", "transformers", "peft", "vllm", "deepspeed", "ray", "liger-kernel"),
        **(gpu_identity() if args.device == "cuda" else {}),
    }
    return measure_and_emit(
        result, lambda: measure(job, row, args.agents, args.model, args.device, args.shared, args.out_dir)
    )


if __name__ == "__main__":
    sys.exit(exit_code(main()))
