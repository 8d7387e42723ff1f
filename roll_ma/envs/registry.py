"""Env registry: built-in envs by name, user envs by decorator or import path.

Built-in envs are listed as import paths and imported on first use, so `import roll_ma.envs`
does not import OpenSpiel or math_verify.

In Ray actors name your own env by an import path (`"my_pkg.my_envs:MyEnv"`) or a file
(`"path/to/my_envs.py:MyEnv"`, relative to where the run starts): a class registered with
`@register_env` on the driver is only known in processes that import the module holding the
decorator.
"""

from __future__ import annotations

import difflib
import inspect

from roll_ma.envs.base import MultiAgentEnv

_BUILTIN_ENVS: dict[str, str] = {
    "hanabi": "roll_ma.envs.hanabi:HanabiEnv",
    "tiny_hanabi": "roll_ma.envs.tiny_hanabi:TinyHanabiEnv",
    "kuhn_poker": "roll_ma.envs.poker:KuhnPokerEnv",
    "leduc_poker": "roll_ma.envs.poker:LeducPokerEnv",
    "tic_tac_toe": "roll_ma.envs.tic_tac_toe:TicTacToeEnv",
    "math_selfplay": "roll_ma.envs.math_selfplay:MathSelfPlayEnv",
    "math_reflection": "roll_ma.envs.math_reflection:MathReflectionEnv",
    "marft": "roll_ma.envs.team:TeamEnv",
}
_USER_ENVS: dict[str, type[MultiAgentEnv]] = {}


def register_env(name: str):
    """Class decorator that registers a `MultiAgentEnv` subclass under `name`.

    Example:
        @register_env("my_game")
        class MyGame(MultiAgentEnv): ...
    """

    def decorator(cls: type) -> type:
        if not (isinstance(cls, type) and issubclass(cls, MultiAgentEnv)):
            raise TypeError(f"@register_env({name!r}) needs a MultiAgentEnv subclass, got {cls!r}")
        known = _USER_ENVS.get(name)
        if name in _BUILTIN_ENVS or (known is not None and known is not cls):
            raise ValueError(f"env name {name!r} is already registered; pick another name")
        _USER_ENVS[name] = cls
        return cls

    return decorator


def list_envs() -> list[str]:
    """Sorted names of every known env (built-in and registered)."""
    return sorted(set(_BUILTIN_ENVS) | set(_USER_ENVS))


def resolve_env_class(name_or_path: str) -> type[MultiAgentEnv]:
    """The env class for a registered name, an import path `pkg.module:Class` / `pkg.module.Class`, or a
    file `path/to/file.py:Class` (relative: from the current directory, then the roll_ma checkout)."""
    if name_or_path in _USER_ENVS:
        return _USER_ENVS[name_or_path]
    if name_or_path in _BUILTIN_ENVS:
        return _env_class(_BUILTIN_ENVS[name_or_path])
    if ":" in name_or_path or "." in name_or_path:  # pkg.module:Class, pkg.module.Class, file.py:Class
        return _env_class(name_or_path)
    close = difflib.get_close_matches(name_or_path, list_envs(), n=3)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise ValueError(
        f"Unknown env {name_or_path!r}.{hint} Known envs: {', '.join(list_envs())}. "
        "For your own env pass an import path like 'my_pkg.my_module:MyEnv' or a file like "
        "'path/to/my_env.py:MyEnv'."
    )


def env_uses_problems(name_or_path: str) -> bool:
    """Whether the env's ``reset`` takes a ``problem`` (a math problem row) rather than only a seed."""
    return "problem" in inspect.signature(resolve_env_class(name_or_path).reset).parameters


def make_env(name_or_path: str, **kwargs) -> MultiAgentEnv:
    """Build an env from a registered name or an import path, with its config as kwargs."""
    return resolve_env_class(name_or_path)(**kwargs)


def _env_class(spec: str) -> type[MultiAgentEnv]:
    from roll_ma.workflows.lookup import load_target

    try:
        _, cls = load_target(spec)
    except ValueError as err:
        raise ValueError(f"env {spec!r}: {err}") from err
    if not (isinstance(cls, type) and issubclass(cls, MultiAgentEnv)):
        raise ValueError(f"{spec!r} is not a MultiAgentEnv subclass")
    return cls
