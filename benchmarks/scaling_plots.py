"""The plots of ``pipeline_scaling.py``: a step's parts stacked against the number of agents, and the
timeline of each run's rollouts and trainer work (does the rollout overlap the update?)."""

from __future__ import annotations

import textwrap
from typing import Any

# what one step is made of, in the order of the stacked plot ("other" = the rest of timing/step)
PARTS = ("rollout", "reference", "old_log_probs", "update", "sync_wake", "sync_export", "sync_install")


def plot_timeline(rows: list[dict[str, Any]], path: str, title: str) -> str:
    """One panel per run: rollout bars (the engines' lane) and the trainer's bars (log-probs orange,
    update green, what is left of the sync brown) over the steps, so a reader sees whether they overlap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in rows if r.get("timeline")]
    if not runs:
        raise SystemExit("pipeline_scaling: no run has a timeline to plot (timeline/* metrics)")
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 1.6 * len(runs) + 0.8), squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        for seg in run["timeline"]:
            ax.barh(1, seg["rollout_end"] - seg["rollout_start"], left=seg["rollout_start"], color="tab:blue")
            ax.barh(0, seg["update_start"] - seg["score_start"], left=seg["score_start"], color="tab:orange")
            ax.barh(0, seg["update_end"] - seg["update_start"], left=seg["update_start"], color="tab:green")
            ax.barh(0, seg["sync_end"] - seg["update_end"], left=seg["update_end"], color="tab:brown")
            ax.text(seg["rollout_start"], 1.45, f"s{seg['step']}", fontsize=7)
        ax.set_yticks([0, 1], ["trainer: log-probs,\nupdate, sync", "rollout"])
        ax.set_ylim(-0.6, 1.8)
        ax.set_title(
            f"{run['agents']} agents, max_staleness={run.get('max_staleness', 0)}: "
            f"{run['step_s']:.2f} s a step",
            fontsize=8,
        )
    axes[-1, 0].set_xlabel("seconds")
    fig.suptitle(textwrap.fill(title, 110), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_parts(rows: list[dict[str, Any]], path: str, title: str) -> str:
    """Stacked bars of the step's parts against the number of agents (the first batch size's runs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batch = min(r["episodes"] for r in rows)
    runs = sorted((r for r in rows if r["episodes"] == batch), key=lambda r: r["agents"])
    labels = [str(r["agents"]) for r in runs]
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    bottom = [0.0] * len(runs)
    sync_keys = {"sync_wake": "sync_wake_s", "sync_export": "sync_export_s", "sync_install": "sync_install_s"}
    for part in PARTS:
        vals = [float(r.get(sync_keys.get(part, f"{part}_s")) or 0.0) for r in runs]
        if any(vals):
            ax.bar(labels, vals, bottom=bottom, label=part.replace("_", " "))
            bottom = [b + v for b, v in zip(bottom, vals)]
    other = [max(float(r["step_s"] or 0.0) - b, 0.0) for r, b in zip(runs, bottom)]
    ax.bar(labels, other, bottom=bottom, label="other", color="lightgray")
    ax.set_xlabel("agents (one LoRA adapter each)")
    ax.set_ylabel("seconds per step")
    ax.set_title(textwrap.fill(title, 95), fontsize=8)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
