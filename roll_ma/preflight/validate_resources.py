"""Checks of placement that go beyond one GPU per worker: tensor-parallel engines and roles pinned to nodes.
Run with the rest of ``validate`` before any actor starts (Ray's auth: ``roll_ma/preflight/ray_auth.py``)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

from roll_ma.config.schema import RunConfig
from roll_ma.config.typed import ConfigProblem, suggest
from roll_ma.distributed.placement import default_device_mapping, shared_tp_gpus
from roll_ma.inference.vllm_worker_ext import EXTENSION_CLS, kv_sleep_conflict
from roll_ma.preflight.validate_backends import rollout_traits_or_none

PINNABLE_ROLES = ("rollout", "train", "reference", "teacher", "env")
RAY_BUILTIN_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")
# role -> (its tensor_parallel key, its worker-count key)
TP_KEYS = {"rollout": ("rollout.tensor_parallel", "rollout.num_workers"),
           "teacher": ("teacher.rollout.tensor_parallel", "teacher.rollout.num_workers")}


def gpus_per_worker(cfg: RunConfig) -> dict[str, int]:
    """GPUs one worker of each GPU role takes: an engine's tensor_parallel, 1 for every other role."""
    return {"rollout": cfg.rollout.tensor_parallel, "teacher": cfg.teacher.rollout.tensor_parallel}


def workers_key(role: str) -> str:
    return TP_KEYS[role][1] if role in TP_KEYS else f"{role}.num_workers"


def check_placement(cfg: RunConfig, workers: dict[str, int], problems: list[ConfigProblem]) -> None:
    """``workers``: role -> worker count of every GPU role (0: the role does not run)."""
    _check_role_resources(cfg, problems)
    per = gpus_per_worker(cfg)
    res = cfg.resources
    for prefix, rollout in (("rollout", cfg.rollout), ("teacher.rollout", cfg.teacher.rollout)):
        if "tensor_parallel_size" in rollout.engine_kwargs:  # why: placement must know an engine's GPUs
            problems.append(ConfigProblem(
                f"{prefix}.engine_kwargs.tensor_parallel_size",
                f"set {prefix}.tensor_parallel instead: each worker's placement bundle then holds that many "
                "GPUs (through engine_kwargs the engine would look for GPUs its actor was not given)"))
        theirs = rollout.engine_kwargs.get("worker_extension_cls")
        # on CPU nothing sleeps (vLLM has no sleep mode there), so a user's extension is no conflict
        kv_sleep = rollout.sleep_level == "kv_cache" and res.num_gpus > 0
        if kv_sleep and theirs and theirs != EXTENSION_CLS:
            problems.append(ConfigProblem(f"{prefix}.sleep_level", kv_sleep_conflict(prefix, theirs)))
    for role, (tp_key, _) in TP_KEYS.items():
        k, n = per[role], workers.get(role, 0)
        if k == 1 or n == 0:
            continue
        backend = cfg.rollout.backend if role == "rollout" else cfg.teacher.rollout.backend
        traits = rollout_traits_or_none(backend)
        if traits is not None and not traits.tensor_parallel:
            problems.append(ConfigProblem(tp_key, f"the {backend} backend runs a model on one device; set "
                                                  f"{tp_key.replace('tensor_parallel', 'backend')}=vllm or "
                                                  f"{tp_key}=1"))
        if res.num_gpus == 0:
            problems.append(ConfigProblem(tp_key, f"tensor parallelism shards one engine over {k} GPUs: set "
                                                  f"resources.num_gpus (>= {n * k}) or {tp_key}=1"))
        model = cfg.model if role == "rollout" else cfg.teacher.model
        heads = attention_heads(model.path, model.random_weights)
        if heads is not None and heads % k:
            fits = [d for d in (2, 4, 8, 16) if heads % d == 0]
            problems.append(ConfigProblem(
                tp_key, f"the model {model.path} has {heads} attention heads, which {k} GPUs cannot split "
                        f"evenly (vLLM needs heads % tensor_parallel == 0); use one of {[1, *fits]}"))
    if res.num_gpus == 0 or any(p.key.startswith("resources.device_mapping") for p in problems):
        return
    mapping = default_device_mapping(res.num_gpus, workers, per, res.device_mapping)
    for role, clashes in shared_tp_gpus(mapping, per).items():
        others = sorted(g for r, gpus in mapping.items() if r != role for g in gpus)
        start = (max(others) + 1) if others else 0
        free = list(range(start, start + workers[role] * per[role]))
        what = "; ".join(f"GPUs {g} with {'itself' if r == role else r}" for r, g in clashes.items())
        problems.append(ConfigProblem(
            f"resources.device_mapping.{role}",
            f"with {TP_KEYS[role][0]}={per[role]} each {role} worker takes whole GPUs (Ray gives an actor a "
            f"fraction of one GPU or whole GPUs, never fractions of several), so it cannot share them: it "
            f"shares {what}. Give {role} GPUs of its own, e.g. resources.device_mapping.{role}={free} "
            f"with resources.num_gpus>={start + len(free)}"))
    for role in TP_KEYS:
        gpus = mapping.get(role, [])
        if gpus and role not in res.device_mapping and max(gpus) >= res.num_gpus:
            problems.append(ConfigProblem(
                "resources.num_gpus",
                f"{role} takes {workers[role]} x {per[role]} GPUs ({TP_KEYS[role][0]}) of its own, after the "
                f"GPUs of the other roles: GPUs {gpus[0]}..{gpus[-1]}, but resources.num_gpus="
                f"{res.num_gpus}; raise it to {max(gpus) + 1} or set resources.device_mapping"))


def _check_role_resources(cfg: RunConfig, problems: list[ConfigProblem]) -> None:
    for role, amounts in cfg.resources.role_resources.items():
        key = f"resources.role_resources.{role}"
        if role not in PINNABLE_ROLES:
            problems.append(ConfigProblem(key, f"unknown role{suggest(role, PINNABLE_ROLES)}; roles are "
                                               f"{list(PINNABLE_ROLES)}"))
        for name, amount in amounts.items():
            if name in RAY_BUILTIN_RESOURCES:
                problems.append(ConfigProblem(
                    f"{key}.{name}", "custom resources only: CPUs come from resources.num_cpus_per_worker, "
                                     "GPUs from resources.device_mapping"))
            elif not isinstance(amount, (int, float)) or amount <= 0:
                problems.append(ConfigProblem(f"{key}.{name}", f"must be a number > 0, got {amount!r}"))


def attention_heads(path: str, random_weights: bool = False) -> int | None:
    """The model's attention heads when its config is on this machine (a directory, a built-in model, a
    random-weights shape), else None (a hub name: vLLM checks it when the engine starts)."""
    try:
        if random_weights:
            from roll_ma.models.random_weights import shape_of
            from roll_ma.models.tiny import SHAPES

            return int(SHAPES[shape_of(path)]["num_attention_heads"])
        from roll_ma.models.loading import resolve_model_path

        config = Path(resolve_model_path(path)) / "config.json"
        if config.is_file():
            heads = json.loads(config.read_text()).get("num_attention_heads")
            return int(heads) if heads else None
    except (ValueError, OSError, KeyError):
        return None
    return None


# validate(cfg) without the environment and local-GPU checks; passed in by preflight/validate.py, which
# calls this module's checks (so this module never imports it back)
Check = Callable[[RunConfig], list[ConfigProblem]]


def too_few_gpus_message(cfg: RunConfig, have: int, check: Check) -> str:
    """A config asks for more GPUs than this machine has: the fix as one list of overrides that works here
    (found by ``check``ing the config with them), or joining a cluster."""
    n = cfg.resources.num_gpus
    overrides, left = fit_to_gpus(cfg, have, check)
    here = "this machine's CPU" if have == 0 else f"this machine's {have} GPU{'s' * (have != 1)}"
    text = (f"asks for {n} GPU{'s' * (n != 1)} but this machine has {have or 'none'}. Run it on a cluster "
            f"(RAY_ADDRESS=<head>:6379), or on {here} with the overrides: {' '.join(overrides)}")
    if have == 0:
        text += " (slow for a large model; the *_tiny configs are made for CPU)"
    if left:
        text += "; with those the config still has: " + "; ".join(str(p) for p in left)
    return text


def fit_to_gpus(cfg: RunConfig, gpus: int, check: Check) -> tuple[list[str], list[ConfigProblem]]:
    """The overrides that fit ``cfg`` onto ``gpus`` local GPUs (0: CPU), and the problems left with them."""
    trial = copy.deepcopy(cfg)
    overrides = [f"resources.num_gpus={gpus}"]
    trial.resources.num_gpus = gpus
    if trial.resources.device_mapping:  # the default placement of every role onto the GPUs there are
        overrides.append("'~resources.device_mapping'")
        trial.resources.device_mapping = {}
    left = check(trial)
    if gpus == 0 and any(p.key == "model.dtype" for p in left):
        overrides.append("model.dtype=float32")
        trial.model.dtype = "float32"
        left = check(trial)
    return overrides, left
