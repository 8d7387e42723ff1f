"""The built-in model's data: tiny Hanabi answers from fixed habits or uniformly random moves."""

from __future__ import annotations

import random
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
build = pytest.importorskip("build_tiny_model")


def test_habits_cover_every_information_set_once_and_are_fixed_by_the_seed():
    from roll_ma.envs import make_env

    env = make_env("tiny_hanabi")
    habits = build.hanabi_habits(env, random.Random(1))
    # player 0: 2 cards; player 1: 2 cards x 3 partner actions
    assert len(habits) == 2 + 6
    assert all(len(w) == 3 and sum(w) == pytest.approx(1.0) and min(w) > 0 for w in habits.values())
    assert habits == build.hanabi_habits(env, random.Random(1))
    assert habits != build.hanabi_habits(env, random.Random(2))
    # the two cards of one seat get different preferences: the answer depends on the card
    p0 = [w for key, w in habits.items() if key.startswith("Player 0.")]
    assert p0[0] != p0[1]


def answer_counts(examples, n: int) -> dict[str, Counter]:
    counts: dict[str, Counter] = {}
    for _ in range(n):
        prompt, reply = examples.hanabi_turn()
        key = prompt.split("<|im_start|>user\n")[1].split("<|im_end|>")[0]
        counts.setdefault(key, Counter())[reply] += 1
    return counts


def test_habits_answers_follow_the_habit_and_uniform_answers_do_not():
    habits_examples = build.Examples(0, "habits")
    for key, counts in answer_counts(habits_examples, 4000).items():
        total = sum(counts.values())
        for action, weight in zip(["a0", "a1", "a2"], habits_examples.habits[key], strict=True):
            assert counts[f"<answer>{action}</answer>"] / total == pytest.approx(weight, abs=0.08)
    uniform = build.Examples(0)
    assert uniform.habits is None
    for counts in answer_counts(uniform, 4000).values():
        total = sum(counts.values())
        assert all(abs(c / total - 1 / 3) < 0.08 for c in counts.values())
