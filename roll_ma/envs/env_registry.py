"""Envs by name: ``env.name`` is a built-in name, a registered one, or a spec (``roll_ma.registry``).

Built-in envs are listed as import paths and imported on first use, so `import roll_ma.envs`
does not import OpenSpiel or math_verify.

Name your own env by an import path (`"my_pkg.my_envs:MyEnv"`) or a file (`"path/to/my_envs.py:MyEnv"`,
relative to where the run starts): every env worker imports it from there. A class registered with
`@register_env` is only known in processes that import the module holding the decorator.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from roll_ma.envs.base import MultiAgentEnv
from roll_ma.registry import Registry, subclass_of

ENVS: Registry[type[MultiAgentEnv]] = Registry(
    "env",
    "env.name",
    "roll_ma.envs.register_env",
    builtins={
        "hanabi": "roll_ma.envs.hanabi:HanabiEnv",
        "tiny_hanabi": "roll_ma.envs.tiny_hanabi:TinyHanabiEnv",
        "kuhn_poker": "roll_ma.envs.poker:KuhnPokerEnv",
        "leduc_poker": "roll_ma.envs.poker:LeducPokerEnv",
        "tic_tac_toe": "roll_ma.envs.tic_tac_toe:TicTacToeEnv",
        "math_selfplay": "roll_ma.envs.math_selfplay:MathSelfPlayEnv",
        "math_reflection": "roll_ma.envs.math_reflection:MathReflectionEnv",
        "marft": "roll_ma.envs.team:TeamEnv",
    },
    check=subclass_of(MultiAgentEnv),
)


def register_env(name: str) -> Callable[[type], type]:
    """Class decorator that registers a `MultiAgentEnv` subclass under `name`.

    Example:
        @register_env("my_game")
        class MyGame(MultiAgentEnv): ...
    """
    return ENVS.register(name)


def list_envs() -> list[str]:
    """Sorted names of every known env (built-in and registered)."""
    return list(ENVS.names())


def resolve_env_class(name_or_path: str) -> type[MultiAgentEnv]:
    """The env class for a built-in or registered name, an import path `pkg.module:Class` /
    `pkg.module.Class`, or a file `path/to/file.py:Class` (relative: from the current directory, then the
    roll_ma checkout); ValueError in the config's words when it names none."""
    return ENVS.get(name_or_path)


def env_uses_problems(name_or_path: str) -> bool:
    """Whether the env's ``reset`` takes a ``problem`` (a math problem row) rather than only a seed."""
    return "problem" in inspect.signature(resolve_env_class(name_or_path).reset).parameters


def make_env(name_or_path: str, **kwargs) -> MultiAgentEnv:
    """Build an env from a registered name or an import path, with its config as kwargs."""
    return resolve_env_class(name_or_path)(**kwargs)
