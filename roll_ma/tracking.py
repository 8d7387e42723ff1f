"""Metric sinks: metrics.jsonl (always), console summary, tensorboard and wandb (by config), rewards.png.

Names follow one scheme: ``agent/<name>/...`` per agent, ``rollout/...``, ``eval/...``,
``timing/...`` (seconds), ``system/...`` (throughput, memory). One metrics.jsonl line per
step: metrics logged again for the step of the last line join that line (a phase's timing after
its last train step). On resume the lines after the checkpoint's step are dropped first, so that
every step appears exactly once; a fresh run over an earlier run's metrics says that it replaces
them.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any, Literal

from roll_ma.config.schema import TrackingConfig


def _clean(value: Any) -> Any:
    """JSON-safe scalars: NaN/inf become null so a reader never chokes on the file."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "item"):
        return _clean(value.item())
    return value


def _ordered(row: dict[str, Any]) -> dict[str, Any]:
    """step and wall_time first, then the metrics by name."""
    return {"step": row["step"], "wall_time": row["wall_time"],
            **{k: v for k, v in sorted(row.items()) if k not in ("step", "wall_time")}}


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All complete lines of a metrics.jsonl (a torn last line from a crash is skipped)."""
    rows: list[dict[str, Any]] = []
    p = Path(path)
    if not p.exists():
        return rows
    for line in p.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def truncate_metrics(path: str | Path, last_step: int) -> int:
    """Keep only rows with step <= last_step (atomic rewrite); returns how many rows were dropped."""
    p = Path(path)
    rows = read_metrics(p)
    kept = [r for r in rows if r.get("step", -1) <= last_step]
    tmp = p.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    os.replace(tmp, p)
    return len(rows) - len(kept)


class Tracker:
    """Writes every step's metrics to all configured sinks."""

    def __init__(
        self,
        output_dir: str | Path,
        cfg: TrackingConfig,
        run_name: str,
        config: dict[str, Any],
        resume_step: int | None = None,
    ):
        self.dir = Path(output_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.dir / "metrics.jsonl"
        if resume_step is not None and self.jsonl_path.exists():
            truncate_metrics(self.jsonl_path, resume_step)
        elif resume_step is None and self.jsonl_path.exists():
            earlier = read_metrics(self.jsonl_path)
            self.jsonl_path.unlink()  # a fresh run owns its metrics file
            if earlier:
                n = f"{len(earlier)} line" + "s" * (len(earlier) != 1)
                print(f"[roll_ma] note: {self.jsonl_path} held {n} of an earlier run that left no checkpoint "
                      "to resume from; this run starts afresh and replaces them", flush=True)
        rows = read_metrics(self.jsonl_path)
        self._last: dict[str, Any] | None = rows[-1] if rows else None  # the file's last line
        self._jsonl = open(self.jsonl_path, "a")
        self._tb = None
        self._wandb = None
        if cfg.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.dir / "tensorboard"))
        if cfg.wandb:
            import wandb

            mode: Literal["online", "offline"] = "online" if os.environ.get("WANDB_API_KEY") else "offline"
            self._wandb = wandb.init(
                project=cfg.project,
                name=cfg.run_name or run_name,
                config=config,
                dir=str(self.dir),
                mode=mode,
                resume="allow",
            )

    @property
    def last_step(self) -> int | None:
        """The step of the file's last line (None: no line yet)."""
        return None if self._last is None else self._last.get("step")

    def log(self, metrics: dict[str, Any], step: int) -> None:
        """Write ``metrics`` as the line of ``step``; the step of the last line: added to that line."""
        # wall_time: when the step ended (seconds since the epoch), as TensorBoard's events keep it; the
        # side-by-side benchmark times every framework as the wall time between consecutive step ends
        new = {k: _clean(v) for k, v in metrics.items()}
        if self._last is not None and self.last_step == step:
            row = {**self._last, **new, "wall_time": round(time.time(), 3)}
            self._replace_last_line(row)
        else:
            row = {"step": step, "wall_time": round(time.time(), 3), **new}
            self._jsonl.write(json.dumps(_ordered(row)) + "\n")
            self._jsonl.flush()
            os.fsync(self._jsonl.fileno())  # a SIGKILL right after must not lose a logged step
        self._last = row
        scalars = {k: v for k, v in new.items() if isinstance(v, (int, float))}  # the other sinks: the new
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def _replace_last_line(self, row: dict[str, Any]) -> None:
        """Rewrite the file with ``row`` as its last line (atomic: a kill leaves the old file or the new)."""
        self._jsonl.close()
        lines = self.jsonl_path.read_text().splitlines(keepends=True)
        tmp = self.jsonl_path.with_suffix(".jsonl.tmp")
        with open(tmp, "w") as f:
            f.write("".join(lines[:-1]) + json.dumps(_ordered(row)) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.jsonl_path)
        self._jsonl = open(self.jsonl_path, "a")

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def _rate(tokens_per_s: float) -> str:
    """A tokens/s figure for the console: 812, 12.3k, 1.45M."""
    for div, unit in ((1e6, "M"), (1e3, "k")):
        if tokens_per_s >= div:
            return f"{tokens_per_s / div:.3g}{unit}"
    return f"{tokens_per_s:.0f}"


def step_line(step: int, max_steps: int, metrics: dict[str, Any], agent_names: list[str]) -> str:
    """The step's headline: its time in seconds, rollout and train tokens/s, each agent's mean reward (the
    figure it is trained on), the episodes and turns played, e.g.
    ``step 1/3  13.9 s  rollout 812 tok/s  train 1.2k tok/s  reward solver=0.41 critic=0.12  (128 episodes,
    338 turns)``."""
    parts = [f"step {step}/{max_steps}"]
    if "timing/step" in metrics:
        parts.append(f"{metrics['timing/step']:.1f} s")
    for name, key in (("rollout", "system/rollout_tokens_per_s"), ("train", "system/train_tokens_per_s")):
        if isinstance(metrics.get(key), (int, float)):
            parts.append(f"{name} {_rate(metrics[key])} tok/s")
    rewards = [f"{name}={metrics[f'agent/{name}/reward']:.3g}" for name in agent_names
               if isinstance(metrics.get(f"agent/{name}/reward"), (int, float))]
    if rewards:
        parts.append("reward " + " ".join(rewards))
    played = [f"{int(metrics[k])} {word}" for k, word in (("rollout/episodes", "episodes"),
                                                         ("rollout/turns", "turns")) if k in metrics]
    if played:
        parts.append(f"({', '.join(played)})")
    return "  ".join(parts)


def console_summary(step: int, max_steps: int, metrics: dict[str, Any], agent_names: list[str]) -> str:
    """One compact block per step: the step line (``step_line``), then per agent its reward, loss, KL, grad
    norm, adapter version, log-prob gap and format errors; the critic; the evaluation."""

    def fmt(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = [step_line(step, max_steps, metrics, agent_names)]
    for name in agent_names:
        p = f"agent/{name}/"
        parts = [
            f"{k}={fmt(metrics[p + k])}"
            for k in (  # the reward is on the step line
                "policy_loss",
                "kl",
                "grad_norm",
                "adapter_version",
                "logprob_gap",
                "format_error_rate",
            )
            if p + k in metrics
        ]
        if parts:
            lines.append(f"  {name:>10s}: " + "  ".join(parts))
    critic = [f"{k.split('/')[-1]}={fmt(v)}" for k, v in metrics.items()
              if k == "critic/explained_var" or k.endswith(("/value_loss", "/value_clip_frac"))]
    if critic:  # algorithm.advantage=gae
        lines.append("      critic: " + "  ".join(critic))
    if any(k.startswith("eval/") for k in metrics):
        lines.append(eval_line(metrics))
    return "\n".join(lines)


def eval_line(metrics: dict[str, Any]) -> str:
    """The evaluation's numbers of a step: ``  eval: critic_accuracy=0.55  ...  pass1@turn1=0.5``."""
    evals = sorted((k[len("eval/"):], v) for k, v in metrics.items() if k.startswith("eval/"))
    return "  eval: " + "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in evals)


def initial_eval_summary(max_steps: int, metrics: dict[str, Any]) -> str:
    """The evaluation before the first step (step 0): ``step 0/100  evaluation of the initial adapters``
    and its ``eval_line``."""
    return f"step 0/{max_steps}  evaluation of the initial adapters\n{eval_line(metrics)}"


def eval_change_line(rows: list[dict[str, Any]]) -> str | None:
    """The run's first and last evaluations side by side (counts left out), or None with fewer than two:
    ``[roll_ma] evaluation, step 0 -> 100: pass1@turn1 0.46 -> 0.645, ...``."""
    evals = [r for r in rows if any(k.startswith("eval/") for k in r)]
    if len(evals) < 2:
        return None
    first, last = evals[0], evals[-1]
    names = sorted(k[len("eval/"):] for k in last if k.startswith("eval/") and k in first)
    rates = [n for n in names if not COUNT.search(n)
             and all(isinstance(r["eval/" + n], (int, float)) for r in (first, last))]  # fmt: skip
    changes = [f"{n} {first['eval/' + n]:.3g} -> {last['eval/' + n]:.3g}" for n in rates]
    if not changes:
        return None
    steps = f"step {first.get('step', '?')} -> {last.get('step', '?')}"
    return f"[roll_ma] evaluation, {steps}: " + ", ".join(changes)


COUNT = re.compile(r"(^|[/_])(num|n)_|_(verdicts|inputs|count|tokens)$|(^|[/_])(episodes|turns|count)$")
NOT_A_RATE = re.compile(r"return|reward|score|loss")  # may lie in [0, 1] by chance; never on a rate's axis
SEAT = re.compile(r"_seat(\d+)$")
Series = dict[str, list[tuple[int, float]]]  # curve label -> (step, value) points


def _series(rows: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    return [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]


def _owner(name: str, agent_names: list[str], seats: list[str] | None) -> tuple[str | None, str]:
    """The agent an evaluation metric is about, and its label without that agent: ``critic_precision`` ->
    (critic, precision); ``vs_random/win_rate_seat1`` -> (the agent in seat 1, ``vs_random/win_rate (seat
    1)``); a metric of the whole episode (``pass1@turn1``) -> (None, the name)."""
    seat = SEAT.search(name)
    if seat and seats and int(seat.group(1)) < len(seats) and seats[int(seat.group(1))] in agent_names:
        return seats[int(seat.group(1))], f"{name[:seat.start()]} (seat {seat.group(1)})"
    for agent in sorted(agent_names, key=len, reverse=True):  # the longest name first: critic_2 before critic
        m = re.search(rf"(^|[/_@]){re.escape(agent)}([/_@]|$)", name)
        if m:
            label = (name[:m.start()] + m.group(1) + name[m.end():]).strip("/_@") if m.group(2) else name
            return agent, label or name
    return None, name


def eval_panels(rows: list[dict[str, Any]], agent_names: list[str],
                seats: list[str] | None = None) -> list[tuple[str, str, Series, bool]]:
    """The evaluation's panels of rewards.png, each (title, y label, curves, on a 0-1 axis): per agent the
    rates that are about it, then the rates of the whole episode, then values that are not rates (returns).
    Counts (``num_episodes``, ``critic_verdicts``) are left out: they are in metrics.jsonl and on the
    console, and on a rate's axis they flatten every curve."""
    keys = sorted({k for r in rows for k, v in r.items()
                   if k.startswith("eval/") and isinstance(v, (int, float))})
    rates: dict[str | None, Series] = {}
    others: Series = {}
    for key in keys:
        name = key[len("eval/"):]
        if COUNT.search(name):
            continue
        pts = _series(rows, key)
        agent, label = _owner(name, agent_names, seats)
        if all(0.0 <= v <= 1.0 for _, v in pts) and not NOT_A_RATE.search(name):
            rates.setdefault(agent, {})[label] = pts
        else:
            others[f"{agent}: {label}" if agent else name] = pts
    panels = [(f"{agent}: evaluation", "rate", rates[agent], True) for agent in agent_names if agent in rates]
    if None in rates:
        panels.append(("episodes (all agents): evaluation", "rate", rates[None], True))
    if others:
        panels.append(("evaluation: returns and other values", "value", others, False))
    return panels


def _colours(n: int) -> list[Any]:
    """n distinct colours: tab10, tab20 up to 20 curves, then evenly spaced hues."""
    import matplotlib

    if n <= 10:
        return [matplotlib.colormaps["tab10"](i) for i in range(n)]
    if n <= 20:
        return [matplotlib.colormaps["tab20"](i) for i in range(n)]
    return [matplotlib.colormaps["hsv"](i / n) for i in range(n)]


def plot_rewards(metrics_path: str | Path, out_path: str | Path, agent_names: list[str],
                 seats: list[str] | None = None) -> Path | None:
    """rewards.png (``rewards_figure``) of a run's metrics.jsonl; None when it has no line yet."""
    rows = read_metrics(metrics_path)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = rewards_figure(rows, agent_names, seats)
    out = Path(out_path)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def rewards_figure(rows: list[dict[str, Any]], agent_names: list[str], seats: list[str] | None = None) -> Any:
    """Each agent's training reward, and the evaluation (``eval_panels``) against the step: rates on a 0-1
    axis, one colour per curve, each panel titled with whose numbers it shows."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rewards = {name: _series(rows, f"agent/{name}/reward") for name in agent_names}
    first = ("training: mean turn reward of each agent", "mean turn reward",
             {k: v for k, v in rewards.items() if v}, False)
    # a run of SFT / DPO phases has no rewards: its agents' losses, one curve per agent and objective
    losses = {f"{name} {kind}": _series(rows, f"agent/{name}/{kind}_loss") for name in agent_names
              for kind in ("sft", "dpo")}
    if not first[2] and any(losses.values()):
        first = ("training: each agent's loss", "loss", {k: v for k, v in losses.items() if v}, False)
    panels = [first, *eval_panels(rows, agent_names, seats)]
    cols = 2 if len(panels) in (2, 4) else min(len(panels), 3)
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.5 * cols, 4.2 * nrows), squeeze=False)
    for ax, (title, ylabel, curves, rate) in zip(axes.flat, panels):
        for colour, (label, pts) in zip(_colours(len(curves)), curves.items()):
            ax.plot(*zip(*pts), marker="o", markersize=3, color=colour, label=label)
        ax.set(title=title, xlabel="step", ylabel=ylabel + (" (0-1)" if rate else ""))
        if rate:
            ax.set_ylim(-0.02, 1.02)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if curves:
            ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(panels):]:
        ax.remove()
    fig.tight_layout()
    return fig
