"""Learning-rate schedules of a policy's optimizer: linear warmup, then constant, linear or cosine decay.

The schedule counts optimizer steps of one policy (one adapter), so an agent that trains
every other step or has more mini-batches warms up on its own clock.
"""

from __future__ import annotations

import math

import torch

SCHEDULES = ("constant", "linear", "cosine")
DEFAULT_TOTAL_STEPS = 10**9  # "no horizon": linear and cosine decay stay at ~1.0


class WarmupDecay:
    """lr multiplier after ``s`` completed optimizer steps (a picklable callable for ``LambdaLR``).

    Warmup ramps (s + 1) / warmup so that the first step already moves; decay runs from the
    end of warmup to ``total_steps`` and reaches 0 there (linear, cosine).
    """

    def __init__(self, kind: str, warmup_steps: int, total_steps: int):
        if kind not in SCHEDULES:
            raise ValueError(f"train.lr_schedule={kind!r} is unknown; use one of {list(SCHEDULES)}")
        if warmup_steps < 0 or total_steps < 1:
            raise ValueError(f"need warmup_steps >= 0, total_steps >= 1; got {warmup_steps}, {total_steps}")
        self.kind, self.warmup_steps, self.total_steps = kind, warmup_steps, total_steps

    def __call__(self, s: int) -> float:
        if s < self.warmup_steps:
            return (s + 1) / self.warmup_steps
        if self.kind == "constant":
            return 1.0
        progress = min(1.0, (s - self.warmup_steps) / max(1, self.total_steps - self.warmup_steps))
        if self.kind == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))


def make_lr_scheduler(optimizer: torch.optim.Optimizer, kind: str, warmup_steps: int,
                      total_steps: int | None) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, WarmupDecay(kind, warmup_steps, total_steps or DEFAULT_TOTAL_STEPS))
