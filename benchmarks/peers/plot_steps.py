"""One step of each framework as the sequence of its phases, one bar per table row of a run_all result
(peers.json): the median step on the common clock, split by the framework's own phase timers where it
logs them (roll_ma, verl); the rest of the step is "other". TRL logs no per-phase timers: one bar.

    python benchmarks/peers/plot_steps.py docs/runs/peers_h200x4_2026-11-27/peers.json \
        --rows roll_ma@1,roll_ma_unfused@1,trl_best@1 --out docs/runs/peers_h200x4_2026-11-27/steps.png

Prints each bar's parts (seconds) and writes the plot.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: step_parts_plot

# phase -> (the frameworks' own timer names for it, colour); in the order a synchronous step runs them
PHASES = {
    "rollout": (("rollout",), "tab:blue"),
    "sleep": (("sleep",), "tab:gray"),
    "reference": (("scoring", "ref"), "tab:orange"),
    "old log-probs": (("old_log_probs", "old_log_prob"), "tab:red"),
    "update": (("update",), "tab:green"),
    "sync": (("sync",), "tab:brown"),
}


def bar_parts(row: dict[str, Any]) -> dict[str, float]:
    """Seconds of each phase of a table row, and "other": the step minus the phases it logs."""
    timers = row.get("phases_s") or {}
    parts = {}
    for phase, (names, _) in PHASES.items():
        parts[phase] = next((float(timers[n]) for n in names if timers.get(n) is not None), 0.0)
    rest = max(float(row["step_s"]) - sum(parts.values()), 0.0)
    parts["other" if timers else "no phase timers"] = rest
    return parts


def pick_rows(result: dict[str, Any], wanted: list[str]) -> list[dict[str, Any]]:
    """Rows named ``row@N`` (the job's row name, e.g. roll_ma_unfused@3; ``@Ns``: the shared-adapter row), in
    the order asked; results written before rows had names match on the framework."""
    rows = []
    for name in wanted:
        framework, _, n = name.partition("@")
        shared = n.endswith("s")
        agents = int(n.rstrip("s"))
        match = [
            r
            for r in result["rows"]
            if r.get("row", r["framework"]) == framework
            and r["agents"] == agents
            and bool(r.get("shared")) == shared
            and r.get("step_s")
        ]
        if not match:
            raise SystemExit(f"no measured row {name!r} in the result")
        rows.append(match[0])
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("result", help="run_all's peers.json")
    p.add_argument("--rows", required=True, help="comma list of row@N (row@Ns: shared adapter)")
    p.add_argument("--out", required=True, help="the plot (png)")
    args = p.parse_args(argv)
    result = json.loads(Path(args.result).read_text())
    rows = pick_rows(result, args.rows.split(","))

    from step_parts_plot import draw_bars  # benchmarks/ (on sys.path above)

    bars = []
    for row in rows:
        parts = bar_parts(row)
        shared = " shared" if row.get("shared") else ""
        label = f"{row.get('row', row['framework'])}, N = {row['agents']}{shared}"
        print(f"{label}: step {row['step_s']:.2f} s  " + "  ".join(f"{k} {v:.2f}" for k, v in parts.items()))
        bars.append((label, parts, float(row["step_s"])))
    colors = {phase: color for phase, (_, color) in PHASES.items()}
    colors |= {"other": "lightgray", "no phase timers": "silver"}
    title = f"one step, median of the timed steps, {rows[0].get('gpu', '')}"
    draw_bars(bars, colors, args.out, title, "seconds")
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
