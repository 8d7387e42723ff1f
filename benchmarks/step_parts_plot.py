"""A synchronous step as the sequence of its parts, one bar per run: rollout, reference log-probs, old
log-probs, update, sync, the rest (medians over the chosen steps of each run's metrics.jsonl).

    python benchmarks/step_parts_plot.py --out step.png \
        "before (2026-11-25)=docs/runs/h100_2026-11-25/math_selfplay_7b_metrics.jsonl:2,3,5" \
        "after (2026-11-26)=docs/runs/h100x2_2026-11-26/math_selfplay_7b_after_metrics.jsonl:2,3,4"

Prints each run's parts (seconds) and writes the plot. In a synchronous step the parts run one after
another, so the bar is the step's timeline.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

PARTS = (("rollout", "tab:blue"), ("reference", "tab:orange"), ("old_log_probs", "tab:red"),
         ("update", "tab:green"), ("sync", "tab:brown"))


def parts_of(path: str, steps: list[int]) -> dict[str, float]:
    """Median seconds of each part (and of the whole step) over ``steps`` of one metrics.jsonl."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    chosen = [r for r in rows if r.get("step") in steps]
    if not chosen:
        raise SystemExit(f"{path}: none of steps {steps}")
    med = lambda key: statistics.median(r.get(key, 0.0) for r in chosen)  # noqa: E731
    out = {name: med(f"timing/{name}") for name, _ in PARTS}
    out["step"] = med("timing/step")
    out["other"] = max(out["step"] - sum(out[name] for name, _ in PARTS), 0.0)
    return out


def draw_bars(bars: list[tuple[str, dict[str, float], float]], colors: dict[str, str], out: str, title: str,
              xlabel: str) -> None:
    """One horizontal bar per (label, parts, step seconds), top to bottom: the parts named in ``colors``
    side by side in its order, each part over 3 s labelled, the step's seconds at the bar's end."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    height = 0.9 * len(bars) + 1.4
    fig, ax = plt.subplots(figsize=(9, height))
    labelled: set[str] = set()
    for y, (_label, parts, step) in enumerate(reversed(bars)):
        left = 0.0
        for name, color in colors.items():
            width = parts.get(name, 0.0)
            if width > 0:
                legend = name.replace("_", " ") if name not in labelled else None
                labelled.add(name)
                ax.barh(y, width, left=left, color=color, label=legend)
                if width > 3:
                    ax.text(left + width / 2, y, f"{width:.1f}", ha="center", va="center", fontsize=7)
                left += width
        ax.text(left + 0.5, y, f"{step:.1f} s", va="center", fontsize=8)
    ax.set_yticks(range(len(bars)), [label for label, _, _ in reversed(bars)], fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=9)
    # the legend half an inch under the axis label, whatever the number of bars
    ax.legend(fontsize=7, ncol=6, loc="upper center", bbox_to_anchor=(0.5, -0.55 / (height - 1.0)))
    fig.tight_layout()
    fig.savefig(out, dpi=120, bbox_inches="tight")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", help="LABEL=METRICS.jsonl:STEP,STEP,...")
    p.add_argument("--out", required=True, help="the plot (png)")
    p.add_argument("--title", default="one synchronous step, its parts in order")
    args = p.parse_args(argv)
    runs = []
    for spec in args.runs:
        label, rest = spec.split("=", 1)
        path, steps = rest.rsplit(":", 1)
        runs.append((label, parts_of(path, [int(s) for s in steps.split(",")])))
        print(f"{label}: " + ", ".join(f"{k} {v:.1f}" for k, v in runs[-1][1].items()))

    colors = dict((*PARTS, ("other", "lightgray")))
    bars = [(label, parts, parts["step"]) for label, parts in runs]
    draw_bars(bars, colors, args.out, args.title, "seconds")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
