"""The backends a config names: ``train.strategy``, ``rollout.backend`` and ``teacher.rollout.backend``.

Each is a built-in name, 'pkg.module:Name' or 'path/to/file.py:Name' (``roll_ma.registry``); here, before
any actor starts, it must resolve to a class implementing its Protocol (``TrainBackend``, ``InferBackend``),
as every worker will resolve it. What the other checks ask of a backend (does it train one policy, does it
need vLLM installed, which dtypes does it run in) is a trait of the resolved class (``TrainTraits``,
``RolloutTraits``), never its name, so a user's subclass of a built-in is checked as the built-in is.
"""

from __future__ import annotations

from collections.abc import Callable

from roll_ma.config.schema import RunConfig
from roll_ma.config.typed import ConfigProblem
from roll_ma.inference import INFER_STRATEGIES, rollout_traits
from roll_ma.inference.infer_backend import RolloutTraits
from roll_ma.training import TRAIN_STRATEGIES, train_traits
from roll_ma.training.train_backend import TrainTraits


def rollout_traits_or_none(spec: str) -> RolloutTraits | None:
    """The traits of the rollout backend ``spec``; None when it does not resolve (``check_backends`` says
    why under the key)."""
    return None if INFER_STRATEGIES.unknown(spec) else rollout_traits(spec)


def train_traits_or_none(spec: str) -> TrainTraits | None:
    """The traits of the train backend ``spec``; None when it does not resolve."""
    return None if TRAIN_STRATEGIES.unknown(spec) else train_traits(spec)


def check_backends(cfg: RunConfig, problems: list[ConfigProblem]) -> None:
    """Each backend resolves; the train backend can train what the agents and ``train.full_finetune`` ask,
    and the rollout backend can serve it."""
    add = lambda key, msg: problems.append(ConfigProblem(key, msg))  # noqa: E731
    named = (("train.strategy", cfg.train.strategy, TRAIN_STRATEGIES),
             ("rollout.backend", cfg.rollout.backend, INFER_STRATEGIES),
             ("teacher.rollout.backend", cfg.teacher.rollout.backend, INFER_STRATEGIES))
    for key, spec, table in named:
        why = table.unknown(spec)
        if why:
            add(key, why)
    train, rollout = train_traits_or_none(cfg.train.strategy), rollout_traits_or_none(cfg.rollout.backend)
    trainable = {a.adapter_name for a in cfg.agents if not a.frozen}
    if train is not None and train.trains_one_policy and len(trainable) > 1:
        add("train.strategy",
            f"{cfg.train.strategy} trains one policy but {len(trainable)} adapters are trainable; "
            "use multi_agent_deepspeed or let all agents share one adapter")
    if cfg.train.full_finetune and train is not None and not train.supports_full_finetune:
        add("train.full_finetune",
            "full fine-tuning needs a train.strategy that trains every weight (deepspeed_train, one "
            f"policy); {cfg.train.strategy} trains adapters only")
    if cfg.train.full_finetune and rollout is not None and not rollout.serves_full_weights:
        add("rollout.backend",
            f"full fine-tuning with the {cfg.rollout.backend} backend is not supported yet (it serves "
            "adapters only); use rollout.backend=hf")


def missing_package(key: str, spec: str, installed: Callable[[str], bool]) -> ConfigProblem | None:
    """The problem of the rollout backend ``spec`` (named by ``key``) when the package it needs
    (``RolloutTraits.needs_package``) is not ``installed`` here; None when nothing is missing."""
    traits = rollout_traits_or_none(spec)
    if traits is None or traits.needs_package is None or installed(traits.needs_package):
        return None
    hint = f": {traits.install_hint}" if traits.install_hint else ""
    return ConfigProblem(key, f"{traits.needs_package} is not installed{hint}, or set {key}=hf")


def gpu_dtype_problem(spec: str, dtype: str, dtype_key: str) -> str | None:
    """Why the rollout backend ``spec`` cannot run in ``dtype`` (the value of ``dtype_key``) on GPU (None:
    it can)."""
    traits = rollout_traits_or_none(spec)
    if traits is None or traits.gpu_dtypes is None or dtype in traits.gpu_dtypes:
        return None
    return (f"the {spec} rollout backend runs on GPU in {' or '.join(traits.gpu_dtypes)} only; "
            f"set {dtype_key}={traits.gpu_dtypes[0]}")
