"""Environments: the turn-based multi-agent protocol, a registry, OpenSpiel games, math self-play.

Importing this package imports neither OpenSpiel nor math_verify: built-in envs are loaded by
`make_env` on first use.
"""

from roll_ma.envs.base import BUILTIN_POLICIES, MultiAgentEnv, StepResult, Turn
from roll_ma.envs.env_registry import list_envs, make_env, register_env, resolve_env_class
from roll_ma.envs.math_metrics import aggregate_math_metrics
from roll_ma.envs.parsing import ActionParser, ParseResult, normalize_action

__all__ = [
    "BUILTIN_POLICIES",
    "ActionParser",
    "MultiAgentEnv",
    "ParseResult",
    "StepResult",
    "Turn",
    "aggregate_math_metrics",
    "list_envs",
    "make_env",
    "normalize_action",
    "register_env",
    "resolve_env_class",
]
