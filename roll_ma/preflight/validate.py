"""The config's checks across fields and against the runtime (envs, models, placement, installed
backends, this machine's GPUs), run when a config is loaded, before any Ray actor starts. Each problem
names the key and the fix. The types, ranges and choices of single keys are checked earlier, when the
config is typed (``roll_ma.config.typed``)."""

from __future__ import annotations

import importlib.util
import inspect
import os
from pathlib import Path

from roll_ma.config.run_plan import VARLEN_ATTENTION, rl_loop
from roll_ma.config.schema import RunConfig
from roll_ma.config.seats import resolve_seats
from roll_ma.config.typed import ConfigProblem, suggest
from roll_ma.envs.base import BUILTIN_POLICIES, GameTreeEnv
from roll_ma.models.builtin import BUILTIN_MODELS
from roll_ma.preflight.validate_algorithm import unknown_algorithm_names
from roll_ma.preflight.validate_async import check_async
from roll_ma.preflight.validate_backends import check_backends, gpu_dtype_problem, missing_package

BUILTIN_MODEL_NAMES = list(BUILTIN_MODELS)
ROLES = ("rollout", "train", "reference", "teacher")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_without_machine(cfg: RunConfig) -> list[ConfigProblem]:
    """``validate`` without the checks of this machine (installed backends, its GPUs)."""
    return validate(cfg, check_env=False, check_local_gpus=False)


def validate(cfg: RunConfig, check_env: bool = True, check_local_gpus: bool = True) -> list[ConfigProblem]:
    """Every problem of ``cfg`` at once. ``check_local_gpus=False`` skips only "this machine has too few
    GPUs" (``--cfg`` checks a GPU config on a laptop)."""
    problems: list[ConfigProblem] = []
    _check_agents(cfg, problems)
    _check_env_and_seats(cfg, check_env, problems)
    _check_train(cfg, check_local_gpus, problems)
    _check_installed(cfg, problems)
    _check_model(cfg, problems)
    from roll_ma.preflight.validate_phases import check_phases

    check_phases(cfg, problems, _looks_local)
    _check_resources(cfg, problems, check_local_gpus)
    check_async(cfg, problems)
    return problems


def _check_agents(cfg: RunConfig, problems: list[ConfigProblem]) -> None:
    """Agent names, what agents sharing an adapter must agree on, their initial adapters."""
    add = lambda key, msg: problems.append(ConfigProblem(key, msg))  # noqa: E731
    names = [a.name for a in cfg.agents]
    if not names:
        add("agents", "needs at least one agent, e.g. agents: [{name: player}]")
    for i, name in enumerate(names):
        if names.index(name) != i:
            add(f"agents[{i}].name", f"agent name {name!r} is used twice; agent names must be unique")
        if name in BUILTIN_POLICIES:
            add(f"agents[{i}].name", f"{name!r} is reserved for built-in opponents; rename the agent")
    by_adapter: dict[str, list[int]] = {}
    for i, agent in enumerate(cfg.agents):
        by_adapter.setdefault(agent.adapter_name, []).append(i)
    for adapter, idxs in by_adapter.items():
        loras = {repr(cfg.agent_lora(cfg.agents[i])) for i in idxs}
        if len(loras) > 1:
            add(
                f"agents[{idxs[1]}].lora",
                f"agents {[names[i] for i in idxs]} share adapter {adapter!r} but set "
                "different LoRA settings; give them the same settings or separate adapters",
            )
        frozen = {cfg.agents[i].frozen for i in idxs}
        if len(frozen) > 1:
            add(
                f"agents[{idxs[0]}].frozen",
                f"adapter {adapter!r} is shared by frozen and trainable agents; freeze all of them or none",
            )
        if len({cfg.agents[i].update_every for i in idxs}) > 1:
            add(
                f"agents[{idxs[1]}].update_every",
                f"agents sharing adapter {adapter!r} must use the same update_every",
            )
    for i, agent in enumerate(cfg.agents):
        if agent.init_adapter and not Path(agent.init_adapter).is_dir():
            add(
                f"agents[{i}].init_adapter", f"{agent.init_adapter} is not a directory holding a PEFT adapter"
            )
    rl_only = rl_loop(cfg)
    if names and all(a.frozen for a in cfg.agents) and rl_only:
        add("agents", "every agent is frozen: nothing would train; unfreeze one, or evaluate them with an "
                      "eval phase (phases: [{objective: eval}])")


def _check_env_and_seats(cfg: RunConfig, check_env: bool, problems: list[ConfigProblem]) -> None:
    """The team checks, the env (imported: it may register algorithm names), the seats, the env workers."""
    add = lambda key, msg: problems.append(ConfigProblem(key, msg))  # noqa: E731
    names = [a.name for a in cfg.agents]
    from roll_ma.preflight.validate_team import check_team

    check_team(cfg, problems)  # gae combinations, team env hooks and task
    num_players = None
    if check_env:
        num_players = _check_env(cfg, problems)
    # after the env's import: a module the config names may register a user's estimator or policy loss
    problems.extend(ConfigProblem(key, why) for key, why in unknown_algorithm_names(cfg.algorithm))
    if not cfg.env.workflow:  # why: a workflow calls agents by name (validate_workflow refuses env.seats)
        _check_seats(cfg, num_players, names, problems)
    if cfg.env.groups_per_step % cfg.env.num_workers:
        add(
            "env.groups_per_step",
            f"{cfg.env.groups_per_step} groups cannot be split evenly over "
            f"env.num_workers={cfg.env.num_workers}; use a multiple of {cfg.env.num_workers}",
        )
    if cfg.env.eval_opponent not in BUILTIN_POLICIES:
        add(
            "env.eval_opponent",
            f"must be one of {list(BUILTIN_POLICIES)}{suggest(cfg.env.eval_opponent, BUILTIN_POLICIES)}",
        )


def _check_train(cfg: RunConfig, check_local_gpus: bool, problems: list[ConfigProblem]) -> None:
    """The train strategy and its batch shapes, the reference, the KL term."""
    add = lambda key, msg: problems.append(ConfigProblem(key, msg))  # noqa: E731
    if cfg.model.liger_kernel is True:  # auto falls back where the kernels cannot run (models/liger.py)
        from roll_ma.models.liger import liger_problem

        problem = liger_problem(cfg.resources.num_gpus, check_installed=check_local_gpus)
        if problem:
            add("model.liger_kernel", problem)
    check_backends(cfg, problems)  # they resolve, and can train and serve what the config asks
    # auto turns itself off where it cannot run (training/micro_batches.prompt_sharing); true is checked
    if cfg.train.share_prompt_prefix is True and not cfg.train.remove_padding:
        add(
            "train.share_prompt_prefix",
            "sharing a group's prompt needs packed rows: set train.remove_padding=true",
        )
    attention = cfg.model.attn_implementation
    if cfg.train.share_prompt_prefix is True and attention not in (None, VARLEN_ATTENTION):
        add(
            "train.share_prompt_prefix",
            f"sharing a group's prompt needs the default attention (roll_ma_varlen), not "
            f"model.attn_implementation={cfg.model.attn_implementation}; unset model.attn_implementation",
        )
    if cfg.train.full_finetune and cfg.reference.mode == "train_worker":
        add(
            "reference.mode",
            "full fine-tuning changes the base weights: set reference.mode=worker "
            "(a real reference copy) or none",
        )
    if cfg.train.mini_batch_size is not None and cfg.train.mini_batch_size % cfg.train.num_workers:
        add(
            "train.mini_batch_size",
            f"{cfg.train.mini_batch_size} rows cannot be split evenly over "
            f"train.num_workers={cfg.train.num_workers}; use a multiple of {cfg.train.num_workers}",
        )
    if len(cfg.train.betas) != 2 or not all(0.0 <= b < 1.0 for b in cfg.train.betas):
        add("train.betas", f"must be two numbers in [0, 1), got {cfg.train.betas}")
    if cfg.reference.mode == "none" and cfg.algorithm.kl_coef > 0:
        add(
            "algorithm.kl_coef",
            "a KL term needs reference log-probs: set reference.mode to train_worker or worker, or kl_coef=0",
        )


def _check_installed(cfg: RunConfig, problems: list[ConfigProblem]) -> None:
    """The backends and trackers the config names are installed."""
    add = lambda key, msg: problems.append(ConfigProblem(key, msg))  # noqa: E731
    if not _installed("deepspeed"):
        add(
            "train.strategy",
            "DeepSpeed is not installed: pip install 'roll_ma[dev]' (CPU) or 'roll_ma[vllm]' (GPU)",
        )
    missing = missing_package("rollout.backend", cfg.rollout.backend, _installed)
    if missing:
        problems.append(missing)
    if cfg.tracking.tensorboard and not _installed("tensorboard"):
        add(
            "tracking.tensorboard",
            "tensorboard is not installed: pip install tensorboard, or set it to false",
        )
    if cfg.tracking.wandb and not _installed("wandb"):
        add("tracking.wandb", "wandb is not installed: pip install wandb, or set it to false")


def _check_model(cfg: RunConfig, problems: list[ConfigProblem]) -> None:
    """The model path: a local directory that exists, a hub name, or a known built-in."""
    add = lambda key, msg: problems.append(ConfigProblem(key, msg))  # noqa: E731
    path = cfg.model.path
    looks_local = _looks_local(path)
    if cfg.model.random_weights:
        from roll_ma.models.random_weights import shape_of

        try:
            shape_of(path)
        except ValueError as err:
            add("model.random_weights", str(err))
        looks_local = False
    if looks_local and not Path(path).expanduser().exists():
        add(
            "model.path",
            f"{path} does not exist; give a local model directory, a hub name like "
            "Qwen/Qwen2.5-0.5B-Instruct, or builtin:tiny",
        )
    if path.startswith("builtin:") and path not in BUILTIN_MODEL_NAMES:
        add(
            "model.path",
            f"unknown built-in model {path!r}{suggest(path, BUILTIN_MODEL_NAMES)}; "
            f"the built-in models are {BUILTIN_MODEL_NAMES}",
        )


def _check_seats(
    cfg: RunConfig, num_players: int | None, names: list[str], problems: list[ConfigProblem]
) -> None:
    add = lambda key, msg: problems.append(ConfigProblem(key, msg))  # noqa: E731
    seats = resolve_seats(cfg, num_players)
    for i, seat in enumerate(seats):
        if seat not in names and seat not in BUILTIN_POLICIES:
            add(
                f"env.seats[{i}]",
                f"{seat!r} is not an agent{suggest(seat, names)}; agents are {names}, "
                f"built-in opponents are {list(BUILTIN_POLICIES)}",
            )
    if num_players is not None and len(seats) != num_players:
        add(
            "env.seats" if cfg.env.seats is not None else "agents",
            f"the env {cfg.env.name!r} has {num_players} players but {len(seats)} "
            f"{'seats are' if cfg.env.seats is not None else 'agents are'} configured; "
            "set env.seats to one agent name per seat (an agent may take several seats)",
        )
    unseated = [n for n in names if n not in seats]
    if seats and unseated:
        add("agents", f"agents {unseated} sit in no seat of the env; add them to env.seats or remove them")


def _looks_local(path: str) -> bool:
    """A path that names a directory rather than a hub model (org/name) or a built-in model."""
    local_prefix = path.startswith(("/", "./", "../", "~"))
    return local_prefix or (path.count("/") != 1 and not path.startswith("builtin:"))


def env_parameters(cls: type) -> set[str] | None:
    """Keyword arguments an env class accepts, following **kwargs up the class hierarchy (None: any)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if "__init__" not in vars(klass) or klass is object:
            continue
        params = inspect.signature(vars(klass)["__init__"]).parameters
        names |= {n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
        if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
            return names - {"self"}
    return None


def _check_env(cfg: RunConfig, problems: list[ConfigProblem]) -> int | None:
    """Build the env (cheap) to learn its player count and catch bad env.kwargs and seats."""
    if cfg.env.workflow:
        from roll_ma.preflight.validate_workflow import check_workflow

        return check_workflow(cfg, problems)
    if cfg.env.data.source.startswith("builtin:"):
        problems.append(ConfigProblem(
            "env.data.source",
            "built-in task sets feed workflows (env.workflow); a turn-based env takes 'synthetic' or a "
            "local file",
        ))
    if cfg.env.tools:
        problems.append(
            ConfigProblem("env.tools", "tools are handed to workflows; set env.workflow or remove env.tools")
        )
    try:
        from roll_ma.envs.env_registry import ENVS
        from roll_ma.workers.env_worker import env_kwargs
    except ImportError:
        return None
    why = ENVS.unknown(cfg.env.name)
    if why:
        problems.append(ConfigProblem("env.name", why))
        return None
    cls = ENVS.get(cfg.env.name)
    if cfg.study.action_entropy_coef > 0 and not getattr(cls, "has_action_choices", False):
        problems.append(
            ConfigProblem(
                "study.action_entropy_coef",
                f"{cfg.env.name} answers in free text, so its turns have no legal actions to spread "
                "the bonus over; use algorithm.entropy_coef, or set action_entropy_coef=0",
            )
        )
    if cfg.env.show_greedy_moves and not getattr(cls, "shows_greedy_moves", False):
        problems.append(
            ConfigProblem(
                "env.show_greedy_moves",
                f"{cfg.env.name} does not show other players' greedy moves (SAD); envs that do: tiny_hanabi",
            )
        )
    if "show_greedy_moves" in cfg.env.kwargs:  # why: the env would show moves nobody decodes
        problems.append(ConfigProblem("env.kwargs.show_greedy_moves", "set env.show_greedy_moves instead"))
    if "max_rounds" in cfg.env.kwargs:  # why: one place for the K of the reflection metrics
        problems.append(ConfigProblem("env.kwargs.max_rounds", "set env.max_rounds instead"))
    known = env_parameters(cls)
    if known is not None:
        for key in cfg.env.kwargs:
            if key not in known:
                options = sorted(known - {"seat_agents", "system_prompts", "role_kinds", "show_greedy_moves",
                                         "max_rounds"})
                problems.append(
                    ConfigProblem(
                        f"env.kwargs.{key}",
                        f"{cfg.env.name} takes no setting {key!r}{suggest(key, options)}; it takes {options}",
                    )
                )
    _check_agent_kinds(cfg, getattr(cls, "agent_kinds", ()), problems)
    if any(p.key.startswith("env.kwargs.") or p.key in ("env.path", "env.show_greedy_moves")
           or p.key.endswith((".process", ".kind")) for p in problems):
        return None  # the env would reject the same settings again, in its own words
    try:
        num_players = int(cls(**env_kwargs(cfg.env, cfg.agents, None)).num_players)
    except Exception as err:  # an env rejecting its settings is a config problem, not a crash
        problems.append(ConfigProblem("env.kwargs", f"{cfg.env.name} rejected its settings: {err}"))
        return None
    seats = resolve_seats(cfg, num_players)
    if len(seats) == num_players:
        try:
            env = cls(**env_kwargs(cfg.env, cfg.agents, seats))
        except Exception as err:
            problems.append(ConfigProblem("env.seats", f"{cfg.env.name} rejected the seats {seats}: {err}"))
        else:
            if cfg.study.joint_search_every > 0:
                _check_joint_search(cfg, env, seats, problems)
    return num_players


def _check_agent_kinds(cfg: RunConfig, kinds: tuple[str, ...], problems: list[ConfigProblem]) -> None:
    """Role-based envs: every agent's kind (env.kwargs.role_kinds, else agents[i].kind, else its name) is
    one the env knows; the problem names the key to set."""
    if not kinds:
        return
    given = cfg.env.kwargs.get("role_kinds") or {}
    for i, agent in enumerate(cfg.agents):
        kind = given.get(agent.name) or agent.kind or agent.name
        if kind in kinds:
            continue
        if agent.name in given:
            key, how = f"env.kwargs.role_kinds.{agent.name}", f"is {kind!r}"
        else:
            key = f"agents[{i}].kind"
            how = f"is {kind!r}" if agent.kind else f"is unset, so agent {agent.name!r} has its name as kind"
        problems.append(ConfigProblem(key, f"{how}; {cfg.env.name} knows the kinds {', '.join(kinds)}: set "
                                           f"{key} to one of them"))


def _check_joint_search(cfg: RunConfig, env: object, seats: list[str], problems: list[ConfigProblem]) -> None:
    """Joint search enumerates the game and distills into every seat: small, cooperative, seats trained."""
    key = "study.joint_search_every"
    if not isinstance(env, GameTreeEnv):
        problems.append(ConfigProblem(key, f"{cfg.env.name} is not an OpenSpiel game; joint search needs a "
                                           "small common-payoff one such as tiny_hanabi"))
        return
    trainable = {a.name for a in cfg.agents if not a.frozen}
    untrained = [s for s in seats if s not in trainable]
    if untrained:
        problems.append(ConfigProblem(key, f"seats {untrained} are built-in or frozen; joint search changes "
                                           "every seat's policy, so every seat must be a trainable agent"))
    try:
        env.game_tree()
    except ValueError as err:
        problems.append(ConfigProblem(key, str(err)))


def _check_resources(cfg: RunConfig, problems: list[ConfigProblem], check_local_gpus: bool = True) -> None:
    from roll_ma.preflight.validate_phases import teacher_workers
    from roll_ma.preflight.validate_resources import check_placement, gpus_per_worker, workers_key

    res = cfg.resources
    add = lambda key, msg: problems.append(ConfigProblem(key, msg))  # noqa: E731
    workers = {
        "rollout": cfg.rollout.num_workers,
        "train": cfg.train.num_workers,
        "reference": cfg.reference.num_workers if cfg.reference.mode == "worker" else 0,
        "teacher": teacher_workers(cfg),
    }
    for role in res.device_mapping:
        if role not in ROLES:
            add(
                f"resources.device_mapping.{role}",
                f"unknown role{suggest(role, ROLES)}; roles are {list(ROLES)}",
            )
    if res.num_gpus == 0:
        if any(res.device_mapping.values()):
            used = sorted({g for gpus in res.device_mapping.values() for g in gpus})
            add("resources.device_mapping",
                f"maps roles onto GPUs {used} but resources.num_gpus=0: to run on CPU drop the mapping too "
                f"('~resources.device_mapping'); to run on GPUs set resources.num_gpus={max(used) + 1}")
        if cfg.model.dtype == "float16":
            add("model.dtype", "float16 needs a GPU; use float32 (or bfloat16) on CPU")
        check_placement(cfg, workers, problems)
        return
    why = gpu_dtype_problem(cfg.rollout.backend, cfg.model.dtype, "model.dtype")
    if why:
        add("model.dtype", why)
    for role, gpus in res.device_mapping.items():
        for g in gpus:
            if not 0 <= g < res.num_gpus:
                add(
                    f"resources.device_mapping.{role}",
                    f"GPU {g} is outside 0..{res.num_gpus - 1} (resources.num_gpus={res.num_gpus})",
                )
    per = gpus_per_worker(cfg)
    for role, n in workers.items():
        k = per.get(role, 1)
        mapped = res.device_mapping.get(role)
        if mapped is not None and n and len(mapped) != n * k:
            each = "one GPU each" if k == 1 else f"{k} GPUs each, tensor parallel"
            fix = f"set {workers_key(role)}={len(mapped) // k} or " if len(mapped) % k == 0 and mapped else ""
            add(
                f"resources.device_mapping.{role}",
                f"maps {len(mapped)} GPUs but {role} has {n} workers ({each}); {fix}map {n * k} GPUs",
            )
        if mapped is None and n and n * k > res.num_gpus:
            add(workers_key(role), f"{n} workers need {n * k} GPUs but resources.num_gpus={res.num_gpus}")
    check_placement(cfg, workers, problems)
    if check_local_gpus and not (res.ray_address or os.environ.get("RAY_ADDRESS")):
        have = local_gpu_count()
        if have < res.num_gpus:
            from roll_ma.preflight.validate_resources import too_few_gpus_message

            add("resources.num_gpus", too_few_gpus_message(cfg, have, check_without_machine))


def local_gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0
