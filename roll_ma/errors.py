"""The errors a user can act on: each one's ``str()`` is the whole message (what failed, where, the fix).

Layers raise the narrowest class; the CLI and ``roll_ma.train`` print (or re-raise) any ``RollMaError``
as that one message, without the driver's stack (the full traceback goes to a log file).
"""

from __future__ import annotations


class RollMaError(Exception):
    """Base of roll_ma's user-facing errors: the message says what, where and the fix."""


class PreflightError(RollMaError, ValueError):
    """Something the config names (a data file, a checkpoint, the tokenizer, a hook, the Ray cluster)
    failed its check before any actor started; the message lists every problem found."""

    def __init__(self, problems: list[str], title: str = "the run cannot start"):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{title} ({len(self.problems)} problem{'s' * (len(self.problems) != 1)}):\n{lines}")
