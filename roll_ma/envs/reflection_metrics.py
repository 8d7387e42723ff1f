"""The metrics of multi-agent reflection, with the names used in that line of work (DPSDP, Yuan et al. 2025).

Per episode (``episode_reflection_metrics``), from the K answers the actor gave (its first answer and
K - 1 refinements):

- ``p1@t1``: the first answer is right;
- ``m1@tK``: a majority vote over the K answers is right (answers grouped by their value; a tie goes
  to the latest answer among the tied ones; missing answers do not vote);
- ``p1@tK``: at least one of the K answers is right;
- ``acc@t{i}``: the i-th answer is right (i = 1..K), so a run also shows whether refining helps;
- ``fixed`` / ``broke``: refinements that turned a wrong answer right / a right one wrong, and
  ``from_wrong`` / ``from_right``: refinements of a wrong / right answer (their denominators).

``aggregate_reflection_metrics`` averages them over episodes and adds ``fix_rate`` = fixed /
from_wrong and ``break_rate`` = broke / from_right (left out when the denominator is 0).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from roll_ma.envs.math_verification import as_plain_number, normalize_answer


def majority_correct(answers: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """Whether the majority answer is right; ties go to the latest of the tied answers.

    Answers are grouped by their plain-number value or else their normalised text (not by math
    equivalence: `0.5` and `\\frac{1}{2}` are two groups). ``None`` (no answer) does not vote.
    """
    keys, right = [], {}
    for answer, ok in zip(answers, correct, strict=True):
        if answer is None:
            continue
        value = as_plain_number(answer)
        key = f"n:{value.normalize()}" if value is not None else "t:" + normalize_answer(answer)
        keys.append(key)
        right[key] = bool(ok)
    if not keys:
        return False
    counts = Counter(keys)
    last_seen = {k: i for i, k in enumerate(keys)}
    return right[max(counts, key=lambda k: (counts[k], last_seen[k]))]


def episode_reflection_metrics(
    answers: Sequence[str | None], correct: Sequence[bool], k: int
) -> dict[str, float]:
    """The per-episode metrics of the module docstring; ``k`` names them (the configured rounds).

    An episode that gave fewer than ``k`` answers (cut short) is scored on the answers it gave.
    """
    flags = [bool(c) for c in correct]
    out: dict[str, float] = {"answers": float(len(flags))}
    if not flags:
        return out
    out["p1@t1"] = float(flags[0])
    out[f"m1@t{k}"] = float(majority_correct(answers, flags))
    out[f"p1@t{k}"] = float(any(flags))
    for i, ok in enumerate(flags, start=1):
        out[f"acc@t{i}"] = float(ok)
    pairs = list(zip(flags, flags[1:]))
    out["from_wrong"] = float(sum(not a for a, _ in pairs))
    out["from_right"] = float(sum(a for a, _ in pairs))
    out["fixed"] = float(sum(not a and b for a, b in pairs))
    out["broke"] = float(sum(a and not b for a, b in pairs))
    return out


_COUNTS = ("fixed", "broke", "from_wrong", "from_right", "answers", "format_errors", "turns")


def aggregate_reflection_metrics(episodes: list[dict[str, float]]) -> dict[str, float]:
    """Means over episodes (rates), sums of the counts, and fix / break rates (module docstring)."""
    n = len(episodes)
    out: dict[str, float] = {"num_episodes": float(n)}
    if n == 0:
        return out
    keys = sorted({k for e in episodes for k in e})
    for key in keys:
        values = [float(e[key]) for e in episodes if key in e]
        if key in _COUNTS:
            out[key] = sum(values)
        else:
            out[key] = sum(values) / len(values)
    if out.get("from_wrong", 0) > 0:
        out["fix_rate"] = out["fixed"] / out["from_wrong"]
    if out.get("from_right", 0) > 0:
        out["break_rate"] = out["broke"] / out["from_right"]
    return out
