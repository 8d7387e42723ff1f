"""Load a config as every entry point does: compose it (``config.loading``), type it, and check it across
keys and against the runtime (``validate``). Raises one ``ConfigError`` listing every problem.

The config package stays below everything it configures, so it only composes and types; the checks that
build an env, look up a model shape or plan GPU placement import the runtime and live here.
"""

from __future__ import annotations

from typing import Any

from roll_ma.config.compose import compose_raw, type_config
from roll_ma.config.schema import RunConfig
from roll_ma.config.typed import ConfigError
from roll_ma.preflight.validate import validate


def load_config(
    name: str,
    config_path: str | None = None,
    overrides: list[str] | None = None,
    num_agents: int | None = None,
    check_env: bool = True,
    check_local_gpus: bool = True,
) -> RunConfig:
    """Compose, type and validate; raises ConfigError listing every problem (``check_local_gpus=False``:
    a GPU config checked on a machine without its GPUs)."""
    raw = compose_raw(name, config_path, list(overrides or []))
    return build_config(raw, num_agents, check_env, check_local_gpus)


def _within(key: str, parent: str) -> bool:
    return key == parent or key.startswith((f"{parent}.", f"{parent}["))


def build_config(
    raw: dict[str, Any],
    num_agents: int | None = None,
    check_env: bool = True,
    check_local_gpus: bool = True,
) -> RunConfig:
    """Type and validate a composed config dict; raises ConfigError listing every problem."""
    cfg, problems = type_config(raw, num_agents)
    try:
        checked = validate(cfg, check_env=check_env, check_local_gpus=check_local_gpus)
    except (TypeError, ValueError, AttributeError, KeyError):
        if not problems:  # a type problem already explains why the semantic checks could not run
            raise
        checked = []
    # a key with a type problem was checked at its default: what the checks say of it would mislead
    # (agents=3: "needs at least one agent", "every agent is frozen")
    problems += [p for p in checked if not any(_within(p.key, typed.key) for typed in problems)]
    if problems:
        raise ConfigError(problems)
    return cfg
