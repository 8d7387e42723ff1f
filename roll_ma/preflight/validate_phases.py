"""Checks of supervised runs (train.objective sft / dpo, or phases), run with the others before any actor."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import TypeVar

from roll_ma.config.phase_plan import listed_phases
from roll_ma.config.run_plan import rl_loop, supervised_objective
from roll_ma.config.schema import DPOConfig, RunConfig, SFTConfig
from roll_ma.config.typed import ConfigProblem, suggest, to_dataclass
from roll_ma.models.builtin import BUILTIN_MODELS

Settings = TypeVar("Settings", SFTConfig, DPOConfig)  # a phase's objective settings


def check_phases(cfg: RunConfig, problems: list[ConfigProblem], looks_local) -> None:  # noqa: ANN001
    """Every problem of the phases, their data sources and the teacher (nothing when the run is RL only)."""
    add = lambda key, msg: problems.append(ConfigProblem(key, msg))  # noqa: E731
    if rl_loop(cfg):
        return
    listed = listed_phases(cfg)
    names = [a.name for a in cfg.agents]
    trainable = [a.name for a in cfg.agents if not a.frozen]
    if cfg.phases and supervised_objective(cfg.train.objective):
        add(
            "train.objective",
            "with `phases` listed, each phase names its objective; leave train.objective=ppo",
        )
    if cfg.train.lr_schedule != "constant":
        add(
            "train.lr_schedule",
            "phase runs use warmup then a constant lr (each phase starts a fresh optimizer); "
            "set train.lr_schedule=constant",
        )
    phase_names = [p.name for p in listed if p.name]
    for i, phase in enumerate(listed):
        key = f"phases[{i}]" if cfg.phases else "train.objective"
        if phase.name and phase_names.count(phase.name) > 1:
            add(f"{key}.name", f"phase name {phase.name!r} is used twice; names must be unique")
        for agent in phase.agents or []:
            if agent not in trainable:
                add(
                    f"{key}.agents",
                    f"{agent!r} is not a trainable agent{suggest(agent, names)}; "
                    f"trainable agents are {trainable}",
                )
        sft = _merged(SFTConfig, cfg.sft, phase.sft, f"{key}.sft", problems)
        dpo = _merged(DPOConfig, cfg.dpo, phase.dpo, f"{key}.dpo", problems)
        if phase.objective == "sft" and sft is not None:
            _check_sft(cfg, sft, key, problems, looks_local)
        if phase.objective == "dpo" and dpo is not None:
            _check_dpo(cfg, dpo, key, problems)


def teacher_workers(cfg: RunConfig) -> int:
    """The teacher's rollout workers if a phase reads from the teacher, else 0."""
    listed = listed_phases(cfg)
    uses = any(p.objective == "sft" and {**dataclasses.asdict(cfg.sft), **p.sft}.get("source") == "teacher"
               for p in listed)
    return cfg.teacher.rollout.num_workers if uses else 0


def _merged(
    cls: type[Settings], base: Settings, overrides: dict, key: str, problems: list[ConfigProblem]
) -> Settings | None:
    obj, found = to_dataclass(cls, {**dataclasses.asdict(base), **overrides})
    problems.extend(ConfigProblem(f"{key}.{p.key}", p.message) for p in found)
    return None if found else obj


def _branching_env(cfg: RunConfig) -> bool:
    try:
        from roll_ma.envs.env_registry import resolve_env_class

        return bool(getattr(resolve_env_class(cfg.env.name), "supports_branching", False))
    except (ValueError, ImportError):
        return True  # an unknown env is reported under env.name already


def _check_sft(cfg: RunConfig, sft: SFTConfig, key: str, problems: list[ConfigProblem], looks_local) -> None:  # noqa: ANN001
    add = lambda k, msg: problems.append(ConfigProblem(k, msg))  # noqa: E731
    if sft.source == "file" and not sft.path:  # the file itself is read by the pre-flight check
        add("sft.path", f"{key}: sft.source=file needs sft.path (a .jsonl/.parquet/.json of chat messages)")
    if sft.source == "teacher":
        path = cfg.teacher.model.path
        if not path:
            add(
                "teacher.model.path",
                "sft.source=teacher needs a teacher: set teacher.model.path (a hub name, a "
                "local directory or builtin:tiny)",
            )
        elif path.startswith("builtin:") and path not in BUILTIN_MODELS:
            add(
                "teacher.model.path",
                f"unknown built-in model {path!r}; the built-in models are {list(BUILTIN_MODELS)}",
            )
        elif looks_local(path) and not Path(path).expanduser().exists():
            add("teacher.model.path", f"{path} does not exist; give a local model directory or a hub name")
        _check_teacher_backend(cfg, problems)
    if sft.source in ("teacher", "rejection") and not _branching_env(cfg):
        add(
            "sft.source",
            f"{sft.source} makes data by playing {cfg.env.name}, which does not start from given "
            "states; use env.name=math_reflection, or sft.source=file",
        )


def _check_teacher_backend(cfg: RunConfig, problems: list[ConfigProblem]) -> None:
    """The teacher's rollout backend is installed and runs in the teacher's dtype (its traits, not its
    name)."""
    from roll_ma.preflight.validate_backends import gpu_dtype_problem, missing_package

    backend = cfg.teacher.rollout.backend
    missing = missing_package("teacher.rollout.backend", backend,
                              lambda module: importlib.util.find_spec(module) is not None)
    if missing:
        problems.append(missing)
    why = gpu_dtype_problem(backend, cfg.teacher.model.dtype, "teacher.model.dtype")
    if why and cfg.resources.num_gpus > 0:
        problems.append(ConfigProblem("teacher.model.dtype", why))


def _check_dpo(cfg: RunConfig, dpo: DPOConfig, key: str, problems: list[ConfigProblem]) -> None:
    add = lambda k, msg: problems.append(ConfigProblem(k, msg))  # noqa: E731
    if dpo.source == "file":
        if not dpo.path:  # the file itself is read by the pre-flight check
            add(
                "dpo.path",
                f"{key}: dpo.source=file needs dpo.path (TRL's prompt/chosen/rejected + an agent column)",
            )
    elif not _branching_env(cfg):
        add(
            "dpo.source",
            f"built pairs branch episodes of the reflection game; {cfg.env.name} cannot start from a "
            "given state: use env.name=math_reflection, or dpo.source=file",
        )
    if dpo.reference != "base" and cfg.train.full_finetune:
        add("dpo.reference", "full fine-tuning has no adapter to freeze as the reference; use LoRA adapters")
    if dpo.reference == "base" and cfg.train.full_finetune:
        add("dpo.reference", "full fine-tuning moves the base weights: there is no fixed reference; use LoRA")
