"""Throughput of the GPU sweep of ``pipeline_scaling.py --gpus``: episodes/s and tokens/s per run, the
scaling efficiency against one GPU, and the plot of throughput vs GPUs.

Fixed per-GPU work: a run on G GPUs plays G times the episodes of the 1-GPU run, with G rollout
engines and G train ranks (every role colocated on every GPU), so perfect scaling keeps the step time
and multiplies the throughput by G. Efficiency at G = throughput(G) / (G x throughput(1)).
"""

from __future__ import annotations

from typing import Any


def planned_gpu_runs(agents: list[int], episodes_per_gpu: int, gpus: list[int]) -> list[tuple[int, int, int]]:
    """(agents, episodes per step, GPUs) of every run: each agent count at each GPU count."""
    return [(n, episodes_per_gpu * g, g) for n in agents for g in gpus]


def add_throughput(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per row: ``episodes_per_s``, ``tokens_per_s`` (response tokens generated and trained on) and, where
    the same agent count ran on 1 GPU, ``efficiency`` and ``speedup`` against it. Rows change in place."""
    for r in rows:
        step = r.get("step_s")
        r["episodes_per_s"] = r["episodes"] / step if step else None
        tokens = r.get("response_tokens")
        r["tokens_per_s"] = tokens / step if step and tokens is not None else None
    for r in rows:
        one = next((b for b in rows if b["agents"] == r["agents"] and b.get("gpus") == 1), None)
        base = one and one.get("episodes_per_s")
        if base and r.get("episodes_per_s"):
            r["speedup"] = r["episodes_per_s"] / base
            r["efficiency"] = r["speedup"] / r["gpus"]
    return rows


def plot_throughput(rows: list[dict[str, Any]], path: str, title: str) -> str:
    """Episodes/s against GPUs (one line per agent count) beside the ideal line through the 1-GPU point,
    and the scaling efficiency on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, eff) = plt.subplots(1, 2, figsize=(10, 4.2))
    for n in sorted({r["agents"] for r in rows}):
        runs = [r for r in rows if r["agents"] == n and r.get("episodes_per_s")]
        runs.sort(key=lambda r: r["gpus"])
        if not runs:
            continue
        gpus = [r["gpus"] for r in runs]
        line = ax.plot(gpus, [r["episodes_per_s"] for r in runs], "o-", label=f"{n} agent(s)")[0]
        base = next((r["episodes_per_s"] for r in runs if r["gpus"] == 1), None)
        if base:
            color = line.get_color()
            ax.plot(gpus, [base * g for g in gpus], ":", color=color, label=f"{n} agent(s), ideal")
            eff.plot(gpus, [r.get("efficiency") for r in runs], "o-", color=color, label=f"{n} agent(s)")
    for a in (ax, eff):
        a.set_xlabel("GPUs (rollout engines = train ranks = GPUs, colocated)")
        a.set_xscale("log", base=2)
        a.set_xticks(sorted({r["gpus"] for r in rows}), [str(g) for g in sorted({r["gpus"] for r in rows})])
        a.legend(fontsize=8)
    ax.set_ylabel("episodes per second")
    eff.set_ylabel("scaling efficiency vs 1 GPU")
    eff.axhline(0.85, color="gray", linestyle="--", linewidth=0.8)  # the goal of issue 25
    eff.set_ylim(0, 1.1)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
