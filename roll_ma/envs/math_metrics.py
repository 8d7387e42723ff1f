"""Aggregating per-episode math self-play metrics into the numbers a run reports.

Input: the dicts of `MathSelfPlayEnv.episode_metrics()`. Output keys (a key is left out when
its denominator is 0, so no NaN and no misleading 0.0; the counts are always reported):

- `pass1@turn1`: mean `correct_turn1` (the solver's first answer).
- `pass1@turnK`: mean `correct_final` (the latest answer when the episode ended).
- `maj1@turnK`: mean `majority_correct` (majority vote over the episode's answers).
- `critic_precision` / `critic_recall`: of the verdict `Incorrect` as the positive class,
  tp / (tp + fp) and tp / (tp + fn), summed over episodes.
- `critic_accuracy`: (tp + tn) / verdicts; `critic_always_correct_accuracy`: the accuracy of a
  critic that always says `Correct`, (fp + tn) / verdicts (= the share of judged answers
  that were right): the baseline a useful critic must beat.
- `critic_balanced_accuracy`: the mean of the recall of `Incorrect` and the recall of `Correct`,
  (tp / (tp + fn) + tn / (tn + fp)) / 2: 0.5 for any constant or random critic whatever the
  solver's accuracy (plain accuracy rewards always saying `Correct` once the solver is good).
- `refiner_fix_rate`: fixed / refiner turns whose input answer was wrong;
  `refiner_break_rate`: broke / refiner turns whose input answer was right.
- `format_error_rate`: format errors / turns.
"""

from __future__ import annotations


def _ratio(out: dict[str, float], key: str, num: float, den: float) -> None:
    if den > 0:
        out[key] = num / den


def aggregate_math_metrics(episodes: list[dict[str, float]]) -> dict[str, float]:
    """Aggregate `episode_metrics()` dicts of math episodes (see module docstring)."""
    n = len(episodes)
    out: dict[str, float] = {"num_episodes": float(n)}
    if n == 0:
        return out

    def total(key: str) -> float:
        return float(sum(e.get(key, 0.0) for e in episodes))

    out["pass1@turn1"] = total("correct_turn1") / n
    out["pass1@turnK"] = total("correct_final") / n
    out["maj1@turnK"] = total("majority_correct") / n
    tp, fp, fn, tn = (total(f"critic_{k}") for k in ("tp", "fp", "fn", "tn"))
    verdicts = tp + fp + fn + tn
    out["critic_verdicts"] = verdicts
    _ratio(out, "critic_precision", tp, tp + fp)
    _ratio(out, "critic_recall", tp, tp + fn)
    _ratio(out, "critic_accuracy", tp + tn, verdicts)
    _ratio(out, "critic_always_correct_accuracy", fp + tn, verdicts)
    if tp + fn > 0 and tn + fp > 0:
        out["critic_balanced_accuracy"] = (tp / (tp + fn) + tn / (tn + fp)) / 2
    wrong_in, right_in = total("refiner_wrong_inputs"), total("refiner_right_inputs")
    out["refiner_wrong_inputs"] = wrong_in
    out["refiner_right_inputs"] = right_in
    _ratio(out, "refiner_fix_rate", total("refiner_fixed"), wrong_in)
    _ratio(out, "refiner_break_rate", total("refiner_broke"), right_in)
    _ratio(out, "format_error_rate", total("format_errors"), total("turns"))
    return out
