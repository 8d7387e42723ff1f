"""Synthetic arithmetic problems for CPU demos and tests, deterministic from a seed.

Problems are written with no spaces (`37+48`), answers as integers (`85`); results are
never negative. Levels:

| level | problems                                                                     |
|-------|------------------------------------------------------------------------------|
| 1     | 1-digit `a+b`, `a-b`                                                         |
| 2     | 2-digit `a+b`, `a-b`                                                         |
| 3     | level 2 plus 1-digit `a*b` (each kind equally likely)                        |
| 4     | 3-digit `a+b`, `a-b` and 2-digit times 1-digit `a*b`                         |
| 5     | three operands with precedence, e.g. `12+7*3`, `45-6*4`, `8*9-15`            |

Values are computed from the generated numbers, never by evaluating text.
"""

from __future__ import annotations

import random

MAX_LEVEL = 5


def _add_sub(rng: random.Random, low: int, high: int) -> tuple[str, int]:
    a, b = rng.randint(low, high), rng.randint(low, high)
    if rng.random() < 0.5:
        return f"{a}+{b}", a + b
    a, b = max(a, b), min(a, b)  # why: keep results non-negative
    return f"{a}-{b}", a - b


def _mul(rng: random.Random, a_range: tuple[int, int], b_range: tuple[int, int]) -> tuple[str, int]:
    a, b = rng.randint(*a_range), rng.randint(*b_range)
    return f"{a}*{b}", a * b


def _three_operands(rng: random.Random) -> tuple[str, int]:
    for _ in range(100):
        x, y, z = rng.randint(10, 99), rng.randint(2, 9), rng.randint(2, 9)
        form = rng.randrange(4)
        if form == 0:
            text, value = f"{x}+{y}*{z}", x + y * z
        elif form == 1:
            text, value = f"{x}-{y}*{z}", x - y * z
        elif form == 2:
            text, value = f"{y}*{z}+{x}", y * z + x
        else:
            text, value = f"{y}*{z}-{x}", y * z - x
        if value >= 0:
            return text, value
    return f"{x}+{y}*{z}", x + y * z


def arithmetic_problem(rng: random.Random, level: int) -> dict[str, str]:
    """One problem `{"problem": "37+48", "answer": "85", "level": "2"}` drawn with `rng`."""
    if not 1 <= level <= MAX_LEVEL:
        raise ValueError(f"arithmetic level must be in 1..{MAX_LEVEL}, got {level}")
    if level == 1:
        text, value = _add_sub(rng, 0, 9)
    elif level == 2:
        text, value = _add_sub(rng, 10, 99)
    elif level == 3:
        text, value = _mul(rng, (2, 9), (2, 9)) if rng.random() < 1 / 3 else _add_sub(rng, 10, 99)
    elif level == 4:
        text, value = _mul(rng, (10, 99), (2, 9)) if rng.random() < 1 / 3 else _add_sub(rng, 100, 999)
    else:
        text, value = _three_operands(rng)
    return {"problem": text, "answer": str(value), "level": str(level)}


def generate_arithmetic(n: int, level: int = 2, seed: int = 0) -> list[dict[str, str]]:
    """`n` problems of one level; the same (n, level, seed) always gives the same list."""
    rng = random.Random(f"arithmetic:{level}:{seed}")
    return [arithmetic_problem(rng, level) for _ in range(n)]


def is_heldout(problem: str, fraction: float = 0.1) -> bool:
    """Whether a problem text belongs to the fixed held-out split (a hash of the text, not of a seed).

    The built-in tiny model never saw these problems in pre-training, and runs evaluate on
    them, whatever the run's seed.
    """
    import zlib

    return (zlib.crc32(problem.encode()) % 1000) < fraction * 1000
