"""The one helper every config dataclass uses to declare a field with its help text and limits."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def config_field(default: Any = None, help: str = "", factory: Any = None, **limits: Any) -> Any:
    """A dataclass field whose metadata holds ``help`` and the ``min``/``max`` validation checks
    (``min_why`` / ``max_why``: the message for a value below ``min`` / above ``max``, when "must be >= min"
    would not say why; ``refused``: {value: why} for a value a Literal field leaves out on purpose, said after
    "must be one of ...")."""
    meta = {"help": help, **limits}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)
