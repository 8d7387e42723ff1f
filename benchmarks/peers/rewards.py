"""The job's reward in each framework's reward-function shape: SeatGame's digit share of the reply.

SeatGame (benchmarks/seat_game.py) rewards a turn with the share of digits in the reply; the peers get
the same score for the same text. verl and OpenRLHF load this file by path (no package import), so it
imports nothing from roll_ma.
"""

from __future__ import annotations

from typing import Any


def digit_share(text: str) -> float:
    """Share of the characters of ``text`` that are digits (0.0 for an empty reply)."""
    text = text or ""
    return sum(c.isdigit() for c in text) / max(1, len(text))


def _text(completion: Any) -> str:
    """A TRL completion: plain text, or conversational ([{"role": "assistant", "content": ...}])."""
    if isinstance(completion, list):
        return "".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


def trl_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """TRL ``reward_funcs`` entry: one score per completion."""
    return [digit_share(_text(c)) for c in completions]


def verl_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> float:
    """verl ``custom_reward_function`` (``reward.custom_reward_function.name=verl_compute_score``)."""
    return digit_share(solution_str)


def reward_func(queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> dict[str, Any]:
    """OpenRLHF ``--reward.remote_url <this file>``: ``queries`` are prompt + response texts."""
    import torch

    scores = torch.tensor(
        [digit_share(q[len(p) :] if q.startswith(p) else q) for q, p in zip(queries, prompts)],
        dtype=torch.float32,
    )
    return {"rewards": scores, "scores": scores, "extra_logs": {}}
