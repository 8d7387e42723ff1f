"""The Python entry point beside the CLI: ``roll_ma.train(config_or_path, **overrides)``.

    import roll_ma

    metrics = roll_ma.train("math_tool_tiny", trainer__max_steps=2, env={"group_size": 2})
    print(metrics["rollout/env/correct"])

``config_or_path`` is a shipped config's name (as ``--config_name``), a path to a yaml file, a dict
(the yaml's content) or a ``RunConfig``. Overrides are keyword arguments: ``a__b=v`` sets key
``a.b`` (``agents__0__lr=1e-4`` indexes a list), a dict value merges into a section. The config is
composed, typed and validated exactly like ``start_pipeline.py`` does (every problem at once, as a
``ConfigError``), and the run writes the same outputs (``metrics.jsonl``, checkpoints, plots).
Returns the metrics of the last step, its number under ``"step"`` (a run already at
``trainer.max_steps`` returns that step's metrics from ``metrics.jsonl`` without starting anything).

A failure the CLI prints as a few lines is raised here as the same typed error (a ``RollMaError``:
``WorkerError`` for a worker's, ``PreflightError`` for a check before the actors start) whose message
is those lines; the full traceback is in the log file its last line names (``err.log_path``).
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from roll_ma.config.schema import RunConfig


def train(config_or_path: str | os.PathLike | Mapping | RunConfig, **overrides: Any) -> dict[str, Any]:
    """Validate the config (with overrides) and run it; returns the final step's metrics."""
    return run_config(resolve_config(config_or_path, **overrides))


def run_config(cfg: RunConfig) -> dict[str, Any]:
    """Run a validated config; a ``RollMaError`` leaves its full traceback in a log file under
    ``trainer.output_dir/logs`` and names it in its message (the CLI runs configs through this too).

    Whatever the ending (success, an error, Ctrl-C, SIGTERM: ``roll_ma.interrupts``), the run leaves
    nothing behind: its workers are stopped (their shared-memory files deleted), and a Ray it started
    itself is stopped too (a Ray the caller started stays)."""
    import ray

    # the entry point wires the studies in (the joint search's step kind): the core imports none of them
    import roll_ma.studies  # noqa: F401
    from roll_ma.distributed.ray_env import shutdown_ray
    from roll_ma.error_report import attach_log
    from roll_ma.errors import PreflightError, RollMaError, RunStartError
    from roll_ma.interrupts import stop_signals
    from roll_ma.pipelines import run_training
    ours = not ray.is_initialized()
    with stop_signals():  # around the shutdown too: a second signal then is ignored, not fatal
        try:
            return run_training(cfg)
        except (PreflightError, RunStartError):  # its message is the whole story: no traceback to log
            raise
        except RollMaError as err:
            attach_log(err, cfg.trainer.output_dir)
            raise
        finally:
            if ours:
                shutdown_ray()


def resolve_config(config_or_path: str | os.PathLike | Mapping | RunConfig, **overrides: Any) -> RunConfig:
    """The validated ``RunConfig`` that ``train`` would run (raises ``ConfigError`` listing every problem)."""
    from roll_ma.preflight.config_loader import build_config

    raw = _raw_config(config_or_path)
    if "overrides" in overrides and "overrides" not in raw:  # the CLI's list form, passed to the API
        raise _override_error(
            "overrides",
            "roll_ma.train takes each override as a keyword argument, the key's dots written as two "
            "underscores (roll_ma.train('math_selfplay_tiny', trainer__max_steps=2) for "
            "trainer.max_steps=2), not a list of key=value strings",
        )
    for key, value in overrides.items():
        _set(raw, [part for part in key.replace("__", ".").split(".") if part], value, key)
    return build_config(raw)


def _raw_config(source: Any) -> dict[str, Any]:
    from roll_ma.config.compose import compose_raw
    from roll_ma.config.typed import ConfigError, ConfigProblem

    if isinstance(source, RunConfig):
        return dataclasses.asdict(source)
    if isinstance(source, Mapping):
        raw = copy.deepcopy(dict(source))
        raw.setdefault("name", "run")
        return raw
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(
            f"roll_ma.train needs a config name, a yaml path, a dict or a RunConfig, got {source!r}"
        )
    path = Path(source).expanduser()
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise ConfigError([ConfigProblem("roll_ma.train", f"{path} is not a file (a yaml to run)")])
        return compose_raw(path.stem, str(path.resolve().parent), [])
    return compose_raw(str(source), None, [])


def _set(raw: Any, parts: list[str], value: Any, key: str) -> None:
    """raw[parts...] = value, creating sections on the way; a dict value merges into a dict."""
    if not parts:
        raise _override_error(key, "names no key; use section__key=value, e.g. trainer__max_steps=2")
    node = raw
    for part in parts[:-1]:
        if isinstance(node, list):
            node = node[_index(part, node, key)]
            continue
        if not isinstance(node.get(part), (dict, list)):
            node[part] = {}
        node = node[part]
    last = parts[-1]
    if isinstance(node, list):
        node[_index(last, node, key)] = value
    elif isinstance(value, Mapping) and isinstance(node.get(last), dict):
        node[last] = _merged(node[last], value)
    else:
        node[last] = copy.deepcopy(value)


def _index(part: str, items: list, key: str) -> int:
    if not part.isdigit() or int(part) >= len(items):
        valid = f"0 to {len(items) - 1}" if items else "none: it is empty"
        raise _override_error(key, f"{part!r} is not an index of a list of {len(items)} ({valid})")
    return int(part)


def _override_error(key: str, message: str) -> Exception:
    from roll_ma.config.typed import ConfigError, ConfigProblem

    return ConfigError([ConfigProblem(key, message)])


def _merged(base: dict, update: Mapping) -> dict:
    out = dict(base)
    for k, v in update.items():
        out[k] = (
            _merged(out[k], v)
            if isinstance(v, Mapping) and isinstance(out.get(k), dict)
            else copy.deepcopy(v)
        )
    return out
