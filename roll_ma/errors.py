"""The errors a user can act on: each one's ``str()`` is the whole message (what failed, where, the fix).

Layers raise the narrowest class; the CLI and ``roll_ma.train`` print (or re-raise) any ``RollMaError``
as that one message, without the driver's stack (the full traceback goes to a log file). The CLI's exit
code follows the class: 2 for ``ConfigError`` and ``PreflightError`` (found before anything ran), 1 for
the others.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class RollMaError(Exception):
    """Base of roll_ma's user-facing errors: the message says what, where and the fix.

    Attributes:
        details: text for the log file, not the console (e.g. the traceback of the worker that raised).
        log_path: the log file holding the full traceback, once written (``roll_ma.error_report``); the
            message then ends with a line naming it.
    """

    details: str = ""
    log_path: str | None = None
    log_note: str = ""  # why the log is not under trainer.output_dir/logs, when it could not be written

    def __str__(self) -> str:
        text = super().__str__()
        if not self.log_path:
            return text
        return f"{text}\n  full traceback: {self.log_path}{f' ({self.log_note})' if self.log_note else ''}"

    def __reduce__(self) -> tuple:
        # why: Ray pickles a worker's exception to the driver, and the default rebuilds it as cls(*args),
        # which fails for subclasses whose __init__ takes other arguments than the message
        return (_rebuild, (type(self), self.args, dict(self.__dict__)))


def _rebuild(cls: type[RollMaError], args: tuple, state: dict[str, Any]) -> RollMaError:
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


@dataclass
class ConfigProblem:
    """One problem of a config: the key (or file, or override) it is about, and what is wrong with the fix."""

    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}" if self.key else self.message


class ConfigError(RollMaError, ValueError):
    """One or more problems in a config (its yaml, an override, a key's type or value, keys that do not go
    together); ``str()`` lists them all."""

    def __init__(self, problems: list[ConfigProblem]):
        self.problems = problems
        lines = [f"  - {p}" for p in problems]
        super().__init__(
            f"invalid config ({len(problems)} problem{'s' * (len(problems) != 1)}):\n" + "\n".join(lines)
        )


class UserCodeError(RollMaError, RuntimeError):
    """Code a config names (a prompt hook, a team task, a workflow) raised or returned a wrong value.

    Attributes:
        what: what went wrong, with the value.
        where: ``file:line in function`` and the config key or agent that names the code.
        fix: what to change.
    """

    def __init__(self, what: str, where: str, fix: str):
        self.what, self.where, self.fix = what, where, fix
        super().__init__(f"{what}\n  where: {where}\n  fix: {fix}")


class PreflightError(RollMaError, ValueError):
    """Something the config names (a data file, a checkpoint, the tokenizer, a hook, the Ray cluster)
    failed its check before any actor started; the message lists every problem found."""

    def __init__(self, problems: list[str], title: str = "the run cannot start"):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"{title} ({len(self.problems)} problem{'s' * (len(self.problems) != 1)}):\n{lines}")


class RunStartError(RollMaError, RuntimeError):
    """The run could not start with what it found as it started, after its pre-flight checks passed: the Ray
    cluster it was to join, the GPUs that cluster has, the checkpoints to resume from. The message says what
    and the fix and is the whole story: no traceback is logged for it."""
