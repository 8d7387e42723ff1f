"""Evaluation: fixed seeds, greedy decoding.

workflows: the means of the workflow's metrics over the evaluation tasks (``eval/<metric>``).

math: pass1@turn1, pass1@turnK, maj1@turnK, critic precision / recall / accuracy against the
always-`Correct` baseline, refiner fix and break rates; an env class with ``aggregate_metrics``
reports its own (math_reflection: p1@t1, m1@tK, p1@tK, acc@t{i}, fix and break rates).
games: mean return per seat in
self-play, and each learning seat against a built-in opponent in every other seat
(return and win rate).
"""

from __future__ import annotations

from roll_ma.envs.base import BUILTIN_POLICIES
from roll_ma.pipelines.clusters import RunWorkers
from roll_ma.workers.episodes import EpisodePlanner


def _play(workers: RunWorkers, planner: EpisodePlanner, step: int, seats: list[str] | None,
          tag: str) -> list[dict]:
    n = workers.env.world_size
    results = workers.env.run_episodes(workers.rollout, planner.eval_assignments(n, tag), step, True, seats)
    return [e for r in results for e in r.meta_info["episodes"]]


def evaluate(
    workers: RunWorkers, planner: EpisodePlanner, seats: list[str], opponent: str, step: int
) -> dict[str, float]:
    if planner.is_workflow:  # the workflow's own metrics, averaged over the evaluation tasks
        from roll_ma.metrics import episode_env_metrics

        return episode_env_metrics(_play(workers, planner, step, None, "eval"), "eval")
    if planner.uses_problems:
        from roll_ma.envs.env_registry import resolve_env_class
        from roll_ma.envs.math_metrics import aggregate_math_metrics

        # an env may report its own aggregate (reflection: p1@t1, m1@tK, p1@tK); math self-play's otherwise
        aggregate = getattr(resolve_env_class(planner.cfg.name), "aggregate_metrics", aggregate_math_metrics)
        episodes = _play(workers, planner, step, None, "eval")
        return {f"eval/{k}": v for k, v in aggregate([e["metrics"] for e in episodes]).items()}
    out: dict[str, float] = {}
    episodes = _play(workers, planner, step, None, "eval")
    for seat in range(len(seats)):
        out[f"eval/selfplay/return_seat{seat}"] = sum(e["returns"][seat] for e in episodes) / len(episodes)
    if len(seats) > 1:
        for seat, agent in enumerate(seats):
            if agent in BUILTIN_POLICIES or agent in seats[:seat]:
                continue  # each learning agent once, in its first seat
            versus = [opponent] * len(seats)
            versus[seat] = agent
            games = _play(workers, planner, step, versus, f"eval-vs-{seat}")
            mine = [e["returns"][seat] for e in games]
            wins = [
                1.0
                if r > max(x for i, x in enumerate(e["returns"]) if i != seat)
                else 0.5
                if r == max(x for i, x in enumerate(e["returns"]) if i != seat)
                else 0.0
                for r, e in zip(mine, games)
            ]
            out[f"eval/vs_{opponent}/return_seat{seat}"] = sum(mine) / len(mine)
            out[f"eval/vs_{opponent}/win_rate_seat{seat}"] = sum(wins) / len(wins)
    return out
