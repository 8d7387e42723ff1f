"""Find a config by name, compose it with Hydra, apply overrides and type it (``preflight.config_loader``
adds the checks across keys)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from roll_ma.config.compose_errors import (
    composition_problem,
    defaults_problem,
    first_line,
    interpolation_problem,
    override_problems,
    undecodable_problem,
    yaml_problem,
)
from roll_ma.config.schema import MOVED_KEYS, RunConfig
from roll_ma.config.typed import ConfigError, ConfigProblem, suggest, to_dataclass

REPO_ROOT = Path(__file__).resolve().parents[2]


def config_dirs(config_path: str | None) -> list[Path]:
    """Where configs are looked up: --config_path if given, else ./examples and the repo's examples."""
    if config_path:
        return [Path(config_path).expanduser().resolve()]
    roots = [Path.cwd() / "examples", REPO_ROOT / "examples"]
    seen, dirs = set(), []
    for root in roots:
        if root.is_dir() and root.resolve() not in seen:
            seen.add(root.resolve())
            dirs.extend(sorted({p.parent for p in root.rglob("*.yaml")}))
    return dirs


def available_configs(config_path: str | None = None) -> dict[str, Path]:
    """Config name -> yaml file, over all config directories."""
    found: dict[str, Path] = {}
    for d in config_dirs(config_path):
        for p in sorted(q for q in d.glob("*.yaml") if q.is_file()):
            found.setdefault(p.stem, p)
    return found


def find_config(name: str, config_path: str | None = None) -> Path:
    name = name.removesuffix(".yaml")
    if config_path and not Path(config_path).expanduser().is_dir():
        raise ConfigError([ConfigProblem("--config_path", f"{config_path} is not a directory")])
    configs = available_configs(config_path)
    if name not in configs:
        listing = ", ".join(sorted(configs)) or "none"
        raise ConfigError(
            [
                ConfigProblem(
                    "--config_name", f"no config named {name!r}{suggest(name, configs)}; available: {listing}"
                )
            ]
        )
    return configs[name]


def mars_flags_to_overrides(
    num_agents: int | None, lora_rank: int | None, lora_alpha: float | None
) -> list[str]:
    """MARS-style launcher flags as ordinary overrides (num_agents is applied after composition)."""
    out = []
    if lora_rank is not None:
        out.append(f"lora.rank={lora_rank}")
    if lora_alpha is not None:
        out.append(f"lora.alpha={lora_alpha}")
    return out


def compose_raw(name: str, config_path: str | None, overrides: list[str]) -> dict[str, Any]:
    """Hydra-compose the yaml with overrides into a plain dict (interpolations resolved). Whatever YAML,
    Hydra or OmegaConf refuse is raised as a ``ConfigError`` naming the file and line, or the override."""
    path = find_config(name, config_path)
    bad = override_problems(overrides)
    if bad:
        raise ConfigError(bad)
    try:
        raw = _composed(path, overrides)
    except ConfigError:
        raise
    except Exception as err:  # noqa: BLE001 - each library's error, said in config words
        raise ConfigError(_composition_problems(err, path, overrides)) from None
    raw.pop("hydra", None)
    raw.setdefault("name", path.stem)
    return raw


def _names_itself(path: Path, overrides: list[str]) -> bool:
    """Whether the run's name is its own: set on the command line or in the yaml itself (not in a config its
    ``defaults:`` extend)."""
    if any(o.lstrip("+").split("=", 1)[0] == "name" for o in overrides):
        return True
    import yaml  # type: ignore[import-untyped]  # no stubs installed

    try:
        own = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return True  # composition read it already; keep what it gave
    return isinstance(own, dict) and "name" in own


def shipped_search_path(path: Path) -> list[str]:
    """A user's yaml may extend a shipped config by name (``defaults: [math_selfplay_tiny, _self_]``): the
    folders of the shipped configs go on Hydra's search path, after the yaml's own folder."""
    folders = [d for d in config_dirs(None) if d != path.parent.resolve() and "'" not in str(d)]
    if not folders:
        return []
    return ["hydra.searchpath=[" + ",".join(f"'file://{d}'" for d in folders) + "]"]


def _composed(path: Path, overrides: list[str]) -> dict[str, Any]:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    search = shipped_search_path(path)
    if not _names_itself(path, overrides) and "'" not in path.stem:
        # the yaml's own name, not one its defaults took from a shipped config (whose outputs/ it would share)
        search.append(f"++name='{path.stem}'")
    with initialize_config_dir(config_dir=str(path.parent), version_base=None):
        base = compose(config_name=path.stem, overrides=search)
        # a key the yaml lacks is added ('+key') so that validation can name it with a did-you-mean,
        # together with every other problem, instead of Hydra stopping at the first one
        try:
            cfg = compose(config_name=path.stem, overrides=search + [_addable(o, base) for o in overrides])
        except Exception as err:
            # name the override(s) Hydra could not apply: each one tried alone on the yaml, else the first
            # one that fails after the ones before it (trainer=5 trainer.output_dir=x)
            problems = [p for o in overrides for p in _alone(path, o, base)]
            problems = problems or _conflicts(path, overrides, base)
            if problems:
                raise ConfigError(problems) from err
            raise
    raw = OmegaConf.to_container(cfg, resolve=True)
    if not isinstance(raw, dict):
        raise ConfigError([ConfigProblem(str(path), "must be a mapping of config keys (name:, model:, ...)")])
    return {str(key): value for key, value in raw.items()}


def _alone(path: Path, override: str, base: Any) -> list[ConfigProblem]:
    from hydra import compose

    try:
        compose(config_name=path.stem, overrides=shipped_search_path(path) + [_addable(override, base)])
    except Exception as err:  # noqa: BLE001 - the problem of this one override
        return [composition_problem(err, override)]
    return []


def _conflicts(path: Path, overrides: list[str], base: Any) -> list[ConfigProblem]:
    """The first override that Hydra cannot apply after the ones before it, though it applies alone: named
    with the earlier override that set a key above it (``trainer=5`` before ``trainer.output_dir=x``)."""
    from hydra import compose

    search = shipped_search_path(path)
    for k in range(1, len(overrides)):
        try:
            compose(config_name=path.stem, overrides=search + [_addable(o, base) for o in overrides[: k + 1]])
        except Exception as err:  # noqa: BLE001 - overrides[k] against the ones before it
            key = _key_of(overrides[k])
            above = [o for o in overrides[:k] if key.startswith(_key_of(o) + ".")]
            hydra = composition_problem(err, overrides[k]).message
            if above:
                why = f"cannot be applied after '{above[-1]}', which replaced {_key_of(above[-1])} as a whole"
            else:
                why = f"cannot be applied after the overrides before it, {overrides[:k]}"
            return [ConfigProblem(overrides[k], f"{why} ({hydra})")]
    return []


def _key_of(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _composition_problems(err: BaseException, path: Path, overrides: list[str]) -> list[ConfigProblem]:
    from hydra.errors import MissingConfigException
    from omegaconf.errors import InterpolationResolutionError

    if type(err).__module__.split(".")[0] == "yaml":  # yaml.YAMLError's kinds (yaml ships no types to import)
        return [yaml_problem(err, path)]
    if isinstance(err, UnicodeDecodeError):
        return [undecodable_problem(err, path)]
    if isinstance(err, InterpolationResolutionError):
        return [interpolation_problem(err, overrides, path)]
    if isinstance(err, MissingConfigException):  # a defaults entry (an override's is named by _alone)
        return [defaults_problem(err, path.parent, path, sorted(available_configs()))]
    if isinstance(err, OSError) and getattr(err, "filename", None):
        return [ConfigProblem(str(err.filename), f"cannot be read ({err.strerror or first_line(err)})")]
    return [composition_problem(err, str(path))]


def _addable(override: str, base: Any) -> str:
    from omegaconf import OmegaConf

    key = override.split("=", 1)[0]
    if key.startswith(("+", "~")):
        return override
    try:
        exists = OmegaConf.select(base, key, throw_on_missing=False, default="__missing__") != "__missing__"
    except Exception:  # a key path that does not even parse is left to Hydra's own error
        return override
    return override if exists else "+" + override


def apply_num_agents(raw: dict[str, Any], num_agents: int) -> None:
    """--num_agents N: N agents agent_0..agent_{N-1}, each with its own adapter, settings of the first."""
    if num_agents < 1:
        raise ConfigError([ConfigProblem("--num_agents", f"must be >= 1, got {num_agents}")])
    agents = raw.get("agents") or [{}]
    if len(agents) == num_agents:
        return
    template = {k: v for k, v in dict(agents[0]).items() if k not in ("name", "adapter", "kind")}
    raw["agents"] = [{**template, "name": f"agent_{i}"} for i in range(num_agents)]
    raw.setdefault("env", {})["seats"] = None


def type_config(raw: dict[str, Any], num_agents: int | None = None) -> tuple[RunConfig, list[ConfigProblem]]:
    """A composed config dict as a ``RunConfig``, with the problems of its single keys (unknown keys, types,
    ranges, choices). The checks across keys and against the runtime live in the pre-flight layer:
    ``roll_ma.preflight.config_loader.load_config`` runs both and is what every entry point calls."""
    if num_agents is not None:
        apply_num_agents(raw, num_agents)
    return to_dataclass(RunConfig, raw, MOVED_KEYS)
