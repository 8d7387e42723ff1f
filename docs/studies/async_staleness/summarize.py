"""Tables (markdown) and a plot of the max_staleness study: held-out accuracy per run and per k.

    python docs/studies/async_staleness/summarize.py [ROOT] [--plot eval.png]

ROOT (default: runs/ beside this file) holds one folder per run, k<K>_s<SEED>/metrics.jsonl, and
optionally k<K>_s<SEED>.wall files (run_study.sh: "start end exit_code" per invocation) beside them.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEPS = (0, 25, 50, 75, 100)
STALENESS = ("staleness_mean", "staleness_max", "is_weight_mean", "is_weight_max", "is_weight_truncated")


def load(root: Path) -> dict[tuple[int, int], list[dict]]:
    """(k, seed) -> the run's metrics, one dict per step (the last line of a step wins)."""
    runs = {}
    for f in sorted(root.glob("k*_s*/metrics.jsonl")):
        m = re.fullmatch(r"k(\d+)_s(\d+)", f.parent.name)
        if m:
            by_step = {}
            for line in f.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    by_step[row["step"]] = {**by_step.get(row["step"], {}), **row}
            runs[int(m[1]), int(m[2])] = [by_step[s] for s in sorted(by_step)]
    return runs


def evals(rows: list[dict], metric: str) -> dict[int, float]:
    return {r["step"]: r[metric] for r in rows if metric in r}


def fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def spread(xs: list[float]) -> str:
    if not xs:
        return "-"
    sd = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{statistics.mean(xs):.3f} ± {sd:.3f} [{min(xs):.3f}, {max(xs):.3f}]"


def accuracy_table(runs: dict, metric: str) -> str:
    head = "| run | " + " | ".join(f"step {s}" for s in STEPS) + " | gain 0 -> 100 |"
    out = [f"`{metric}`\n", head, "|" + "---|" * (len(STEPS) + 2)]
    for (k, seed), rows in sorted(runs.items()):
        e = evals(rows, metric)
        gain = e[100] - e[0] if 0 in e and 100 in e else None
        out.append(f"| k={k} seed {seed} | " + " | ".join(fmt(e.get(s)) for s in STEPS) + f" | {fmt(gain)} |")
    for k in sorted({k for k, _ in runs}):
        per = [evals(rows, metric) for (kk, _), rows in sorted(runs.items()) if kk == k]
        cells = [spread([e[s] for e in per if s in e]) for s in STEPS]
        gains = [e[100] - e[0] for e in per if 0 in e and 100 in e]
        out.append(f"| **k={k}** mean ± sd [min, max] | " + " | ".join(cells) + f" | {spread(gains)} |")
    return "\n".join(out)


def staleness_table(runs: dict) -> str:
    """Per run, over its training steps: mean of each agent-averaged staleness / IS metric, and totals."""
    out = [
        "| run | " + " | ".join(STALENESS) + " | dropped_stale_rows (sum) | mixed_version_episodes (mean) |",
        "|" + "---|" * (len(STALENESS) + 3),
    ]
    for (k, seed), rows in sorted(runs.items()):
        train = [r for r in rows if r["step"] > 0]
        cells = []
        for name in STALENESS:
            vals = [v for r in train for key, v in r.items() if re.fullmatch(f"agent/[^/]+/{name}", key)]
            agg = max(vals) if vals and name.endswith("_max") else (statistics.mean(vals) if vals else None)
            cells.append(fmt(agg))
        dropped = sum(r.get("rollout/dropped_stale_rows", 0.0) for r in train)
        mixed = [r["rollout/mixed_version_episodes"] for r in train if "rollout/mixed_version_episodes" in r]
        mixed_mean = fmt(statistics.mean(mixed) if mixed else None)
        out.append(f"| k={k} seed {seed} | " + " | ".join(cells) + f" | {dropped:.0f} | {mixed_mean} |")
    return "\n".join(out)


def wall_table(root: Path, runs: dict) -> str:
    out = [
        "| run | wall s (sum over invocations) | invocations | sum of timing/step s | median step s |",
        "|---|---|---|---|---|",
    ]
    for (k, seed), rows in sorted(runs.items()):
        wall = root / f"k{k}_s{seed}.wall"
        lines = wall.read_text().splitlines() if wall.exists() else []
        segs = [line.split() for line in lines if line.strip()]
        total = sum(int(b) - int(a) for a, b, _ in segs)
        steps = [r["timing/step"] for r in rows if "timing/step" in r]
        out.append(
            f"| k={k} seed {seed} | {total if segs else '-'} | {len(segs) or '-'} | {sum(steps):.0f} | "
            f"{statistics.median(steps) if steps else 0:.2f} |"
        )
    return "\n".join(out)


def plot(runs: dict, metric: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    colors = {0: "tab:blue", 1: "tab:orange", 2: "tab:green"}
    for k in sorted({k for k, _ in runs}):
        per = [evals(rows, metric) for (kk, _), rows in sorted(runs.items()) if kk == k]
        for e in per:
            xs = sorted(e)
            ax.plot(xs, [e[x] for x in xs], color=colors.get(k, "gray"), alpha=0.3, lw=1)
        xs = [s for s in STEPS if all(s in e for e in per)]
        ax.plot(
            xs,
            [statistics.mean(e[s] for e in per) for s in xs],
            color=colors.get(k, "gray"),
            lw=2.5,
            marker="o",
            label=f"max_staleness={k} (mean of {len(per)} seeds)",
        )
    ax.set_xlabel("step")
    ax.set_ylabel(f"{metric} (200 held-out problems)")
    ax.set_title("math_selfplay_tiny: synchronous (k=0) vs asynchronous (k=1); thin lines: seeds", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", nargs="?", default=str(HERE / "runs"))
    ap.add_argument("--metric", default="eval/pass1@turn1", help="the accuracy of the main table")
    ap.add_argument("--also", default="eval/pass1@turnK,eval/critic_balanced_accuracy", help="more tables")
    ap.add_argument("--plot", default=None, help="write the plot of --metric here (png)")
    args = ap.parse_args()
    root = Path(args.root)
    runs = load(root)
    if not runs:
        raise SystemExit(f"no k*_s*/metrics.jsonl under {root}")
    for metric in [args.metric, *filter(None, args.also.split(","))]:
        print(accuracy_table(runs, metric), end="\n\n")
    print(staleness_table(runs), end="\n\n")
    print(wall_table(root, runs))
    if args.plot:
        plot(runs, args.metric, Path(args.plot))


if __name__ == "__main__":
    main()
