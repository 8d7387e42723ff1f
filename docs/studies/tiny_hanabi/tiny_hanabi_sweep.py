"""Many tiny_hanabi_selfplay runs at once (bases x seeds), each pinned to its own cores; where each ends.

    python docs/studies/tiny_hanabi/tiny_hanabi_sweep.py --models builtin:tiny-habits,builtin:tiny \\
        --seeds 1,2,3 --out outputs/sweep
    python docs/studies/tiny_hanabi/tiny_hanabi_sweep.py --seeds 0,1 \\
        --variant "attn=lora.target_modules=[q_proj,v_proj]" \\
        --variant "p1fast=agents.1.lr=6e-4 agents.0.lr=6.7e-5"

One tiny Hanabi run says little: the same settings end on 8 or on ~9 depending on the seed. This
starts one `start_pipeline.py` run per (model, seed), or per (variant, model, seed) with
``--variant LABEL=OVERRIDES`` (that variant's config overrides, space-separated, on top of the
``--set`` ones), ``--cores-per-run`` cores each (its Ray and torch threads size themselves to
those cores), queueing runs when there are more than core groups. ``--time-limit`` stops every run
(SIGKILL) after that many seconds; running the same command again resumes each from its last
checkpoint (``trainer.resume=auto``), so a sweep can be spread over several time-limited sessions.
Printed: per run the greedy self-play return at each evaluation; per model (and variant) how many
runs ended past 8 (the card-blind trap), at >= 9 and at 10.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]  # the repository


def run_label(model: str, seed: int, variant: str = "") -> str:
    name = model.removeprefix("builtin:") if model.startswith("builtin:") else Path(model).name
    return f"{variant + '_' if variant else ''}{name}_seed{seed}"


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``LABEL=key=value key=value`` -> (LABEL, overrides)."""
    label, sep, overrides = text.partition("=")
    if not sep or not label or not overrides.strip() or not label.replace("-", "").replace("_", "").isalnum():
        raise SystemExit(f"--variant {text!r}: expected LABEL=OVERRIDES, e.g. 'slow=train.lr=1e-4 "
                         "algorithm.kl_coef=0.2' (LABEL of letters, digits, - and _)")
    return label, overrides.split()


def parse_variants(texts: list[str]) -> dict[str, list[str]]:
    """Every ``--variant``, by label; without any, one plain variant (label "")."""
    variants: dict[str, list[str]] = {}
    for text in texts:
        label, overrides = parse_variant(text)
        if label in variants:  # two variants would write to the same run folders
            raise SystemExit(f"--variant {label!r} is given twice")
        variants[label] = overrides
    return variants or {"": []}


def eval_returns(metrics: Path) -> list[tuple[int, float]]:
    """(step, greedy self-play return of seat 0) of every evaluation, each step once."""
    if not metrics.exists():
        return []
    seen = {}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        if "eval/selfplay/return_seat0" in row:
            seen[row["step"]] = row["eval/selfplay/return_seat0"]
    return sorted(seen.items())


def launch(model: str, seed: int, variant: str, cores: list[int], out: Path, sets: list[str],
           config: str) -> subprocess.Popen:
    label = run_label(model, seed, variant)
    cmd = [sys.executable, str(ROOT / "start_pipeline.py"), "--config_name", config, f"model.path={model}",
           f"seed={seed}", f"trainer.output_dir={out / label}", *sets]
    with open(out / f"{label}.log", "a") as log:  # the child keeps its own copy
        # the affinity is inherited by the run's Ray and its actors, which size their threads to it
        return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=lambda: os.sched_setaffinity(0, cores))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="builtin:tiny-habits", help="comma-separated model paths")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated run seeds")
    p.add_argument("--set", action="append", default=[], help="a config override for every run (repeatable)")
    p.add_argument("--variant", action="append", default=[],
                   help="LABEL=OVERRIDES: also run every model and seed with these space-separated overrides "
                        "(repeatable; without it one plain variant)")
    p.add_argument("--config", default="tiny_hanabi_selfplay")
    p.add_argument("--out", default="outputs/tiny_hanabi_sweep")
    p.add_argument("--cores-per-run", type=int, default=2)
    p.add_argument("--time-limit", type=float, default=0,
                   help="seconds before every run is stopped (0: none)")
    args = p.parse_args()

    variants = parse_variants(args.variant)
    # seed-major: the first runs to finish cover every model and variant
    runs = [(m, int(s), v) for s in args.seeds.split(",") for v in variants for m in args.models.split(",")]
    cpus = sorted(os.sched_getaffinity(0))
    groups = [cpus[i : i + args.cores_per_run] for i in range(0, len(cpus) - args.cores_per_run + 1,
                                                              args.cores_per_run)]
    if not groups:
        raise SystemExit(f"--cores-per-run {args.cores_per_run} is more than the {len(cpus)} usable cores")
    out = Path(args.out).resolve()  # made once the arguments are known good: a refused run leaves no folder
    out.mkdir(parents=True, exist_ok=True)
    print(f"{len(runs)} runs on {len(groups)} groups of {args.cores_per_run} cores, output {out}", flush=True)

    deadline = time.monotonic() + args.time_limit if args.time_limit > 0 else float("inf")
    pending, running = list(runs), {}  # running: core group index -> (run, process)
    while (pending or running) and time.monotonic() < deadline:
        for g in [g for g in range(len(groups)) if g not in running]:
            if pending:
                run = pending.pop(0)
                sets = [*args.set, *variants[run[2]]]
                running[g] = (run, launch(*run, groups[g], out, sets, args.config))
                print(f"{run_label(*run)} started on cores {groups[g]}", flush=True)
        for g, (run, proc) in list(running.items()):
            if proc.poll() is not None:
                del running[g]
                if proc.returncode != 0:
                    print(f"{run_label(*run)} exited with {proc.returncode}: see its log", flush=True)
        time.sleep(2)
    for _, proc in running.values():  # time is up: the runs resume from their checkpoints next time
        os.killpg(proc.pid, 9)
        proc.wait()

    print("| run | evaluations (step: greedy self-play return) | last |")
    print("|---|---|---|")
    finals: dict[str, list[float]] = {}
    for model, seed, variant in sorted(runs, key=lambda r: (r[2], r[0], r[1])):
        evals = eval_returns(out / run_label(model, seed, variant) / "metrics.jsonl")
        last = evals[-1][1] if evals else float("nan")
        finals.setdefault(f"{variant + ': ' if variant else ''}{model}", []).append(last)
        cells = ", ".join(f"{s}: {r:.2f}" for s, r in evals)
        print(f"| {run_label(model, seed, variant)} | {cells} | {last:.2f} |")
    for name, values in finals.items():
        done = [v for v in values if v == v]
        print(f"{name}: {len(done)} runs with an evaluation, {sum(v > 8.05 for v in done)} past 8, "
              f"{sum(v >= 8.95 for v in done)} at >= 9, {sum(v >= 9.95 for v in done)} at 10")


if __name__ == "__main__":
    main()
