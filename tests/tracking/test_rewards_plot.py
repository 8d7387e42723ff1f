"""rewards.png: rates on a 0-1 axis, counts left out, one colour per curve, each panel titled with whose
numbers it shows; checked on the figure's matplotlib objects."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_hex  # noqa: E402

from roll_ma.tracking import plot_rewards, rewards_figure  # noqa: E402

AGENTS = ["solver", "critic", "refiner"]
MATH_EVAL = {  # what math self-play's evaluation logs (envs/math_metrics.py): rates and counts together
    "eval/num_episodes": 200.0, "eval/pass1@turn1": 0.46, "eval/pass1@turnK": 0.305, "eval/maj1@turnK": 0.305,
    "eval/critic_verdicts": 200.0, "eval/critic_precision": 0.56, "eval/critic_recall": 0.8,
    "eval/critic_accuracy": 0.555, "eval/critic_always_correct_accuracy": 0.46,
    "eval/critic_balanced_accuracy": 0.53, "eval/refiner_wrong_inputs": 86.0,
    "eval/refiner_right_inputs": 67.0, "eval/refiner_fix_rate": 0.08, "eval/refiner_break_rate": 0.57,
    "eval/format_error_rate": 0.0,
}


def _rows(steps: int = 4) -> list[dict]:
    rows = [{"step": 0, **MATH_EVAL}]
    for step in range(1, steps + 1):
        rewards = {f"agent/{a}/reward": 0.1 * i + 0.01 * step for i, a in enumerate(AGENTS)}
        rows.append({"step": step, **rewards, **(MATH_EVAL if step % 2 == 0 else {})})
    return rows


def _panels(fig) -> dict[str, matplotlib.axes.Axes]:
    return {ax.get_title(): ax for ax in fig.axes}


def test_math_selfplay_rates_are_on_a_0_1_axis_per_agent_and_counts_are_left_out():
    fig = rewards_figure(_rows(), AGENTS, AGENTS)
    panels = _panels(fig)
    assert list(panels) == ["training: mean turn reward of each agent", "critic: evaluation",
                            "refiner: evaluation", "episodes (all agents): evaluation"]
    labels = {title: [line.get_label() for line in ax.get_lines()] for title, ax in panels.items()}
    assert labels["training: mean turn reward of each agent"] == AGENTS
    assert labels["critic: evaluation"] == ["accuracy", "always_correct_accuracy", "balanced_accuracy",
                                            "precision", "recall"]
    assert labels["refiner: evaluation"] == ["break_rate", "fix_rate"]
    assert labels["episodes (all agents): evaluation"] == ["format_error_rate", "maj1@turnK", "pass1@turn1",
                                                           "pass1@turnK"]
    for title, ax in panels.items():
        if title.endswith("evaluation"):
            low, high = ax.get_ylim()
            assert -0.05 <= low <= 0 and 1 <= high <= 1.05, (title, ax.get_ylim())
            assert ax.get_ylabel() == "rate (0-1)"
            assert all(0 <= y <= 1 for line in ax.get_lines() for y in line.get_ydata()), title
            assert [list(line.get_xdata()) for line in ax.get_lines()] == [[0, 2, 4]] * len(ax.get_lines())
    everything = [label for names in labels.values() for label in names]
    assert not any(word in label for label in everything for word in ("num_episodes", "verdicts", "inputs"))
    plt.close(fig)


def test_every_curve_of_a_panel_has_its_own_colour_even_with_many_curves():
    many = {f"eval/metric_{i:02d}_rate": 0.01 * i for i in range(23)}
    rows = [{"step": s, "agent/a/reward": 0.5, "agent/b/reward": -0.5, **many} for s in (1, 2)]
    fig = rewards_figure(rows, ["a", "b"])
    for ax in fig.axes:
        colours = [to_hex(line.get_color()) for line in ax.get_lines()]
        assert len(set(colours)) == len(colours), ax.get_title()
    assert len(_panels(fig)["episodes (all agents): evaluation"].get_lines()) == 23
    plt.close(fig)


def test_game_returns_get_their_own_axis_and_win_rates_go_to_the_seats_agent():
    rows = [{"step": s, "agent/alice/reward": 0.1, "eval/selfplay/return_seat0": -1.0 + s,
             "eval/selfplay/return_seat1": 2.0 - s, "eval/vs_random/win_rate_seat0": 0.25 * s,
             "eval/vs_random/return_seat0": 0.5} for s in (0, 2)]
    fig = rewards_figure(rows, ["alice"], ["alice", "random"])
    panels = _panels(fig)
    alice = [line.get_label() for line in panels["alice: evaluation"].get_lines()]
    assert alice == ["vs_random/win_rate (seat 0)"]
    others = panels["evaluation: returns and other values"]
    assert [line.get_label() for line in others.get_lines()] == [  # seat 1 is the built-in random player
        "alice: selfplay/return (seat 0)", "selfplay/return_seat1", "alice: vs_random/return (seat 0)"]
    assert others.get_ylim()[0] < -0.5  # a return below 0 is not cut off by a rate's axis
    plt.close(fig)


def test_a_run_of_sft_and_dpo_phases_plots_each_agents_loss_where_rewards_would_be():
    rows = [{"step": 0, "eval/p1@t1": 0.4},
            *({"step": s, "agent/actor/sft_loss": 1.0 / s, "agent/critic/sft_loss": 2.0 / s} for s in (1, 2)),
            *({"step": s, "agent/actor/dpo_loss": 0.7, "agent/critic/dpo_loss": 0.6} for s in (3, 4)),
            {"step": 4, "eval/p1@t1": 0.5}]
    fig = rewards_figure(rows, ["actor", "critic"])
    panels = _panels(fig)
    losses = panels["training: each agent's loss"]
    labels = [line.get_label() for line in losses.get_lines()]
    assert labels == ["actor sft", "actor dpo", "critic sft", "critic dpo"]
    assert [list(line.get_xdata()) for line in losses.get_lines()] == [[1, 2], [3, 4], [1, 2], [3, 4]]
    assert "training: mean turn reward of each agent" not in panels
    plt.close(fig)


def test_plot_rewards_writes_the_png_of_a_metrics_file(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    assert plot_rewards(metrics, tmp_path / "rewards.png", AGENTS) is None  # no line yet: no plot
    metrics.write_text("".join(json.dumps(r) + "\n" for r in _rows()))
    out = plot_rewards(metrics, tmp_path / "rewards.png", AGENTS, AGENTS)
    assert out == tmp_path / "rewards.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
