"""User functions a config names, imported and matched against the calls roll_ma will make, before any
actor starts: the agents' prompt hooks (``agents[i].process``), a workflow (``env.workflow``) and a team
task (``env.path``). A hook that does not take the arguments it will be given would otherwise fail
inside an env worker, mid-episode.

Only signatures are checked here (importable, callable, plain or async as required, the positional
arguments and configured keyword arguments bind). What the functions return is checked when they run.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from roll_ma.config.schema import RunConfig

HOOK_CALLS = {  # hook name -> (its positional arguments, its kwargs setting)
    "pre_process": (("tokenizer", "prompt_ids", "obs_ids"), "pre_process_kwargs"),
    "post_process": (("tokenizer", "prompt_ids", "response_ids"), "post_process_kwargs"),
}
TASK_CALLS = {"reset": ("problem",), "step": ("actions", "ground_truth")}


def hook_problems(cfg: RunConfig) -> list[str]:
    """Every signature problem of the prompt hooks, the workflow and the team task ``cfg`` names."""
    from roll_ma.preflight.validate_team import TEAM_ENV

    problems: list[str] = []
    if cfg.env.workflow:
        problems += _workflow_problems(cfg)
    elif cfg.env.name == TEAM_ENV:
        problems += _task_problems(cfg)
        for i, agent in enumerate(cfg.agents):
            problems += _process_problems(i, agent)
    return problems


def call_problem(fn: Callable[..., Any], args: tuple[str, ...], kwargs: dict[str, Any], *,
                 has_self: bool = False, want_async: bool | None = None) -> str | None:
    """Why ``fn(*args, **kwargs)`` cannot be called as roll_ma will call it (None: it can).

    ``args`` name the positional arguments (placeholders are bound, nothing is called); ``has_self``:
    ``fn`` is a plain function defined in a class, called on an instance; ``want_async``: it must (True)
    or must not (False) be ``async def``.
    """
    if not callable(fn):
        return f"is a {type(fn).__name__}, not a function"
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None  # a builtin or C function: nothing to read, nothing to refuse
    if want_async is not None and inspect.iscoroutinefunction(fn) != want_async:
        return "must be `async def`" if want_async else "must be a plain `def` (it is `async def`)"
    placeholders = (None,) * (len(args) + has_self)
    try:
        sig.bind(*placeholders, **kwargs)
    except TypeError as err:
        shown = ", ".join([*args, *(f"{k}=..." for k in kwargs)])
        return f"takes {sig} but is called as ({shown}): {err}"
    return None


def _process_problems(i: int, agent: Any) -> list[str]:
    from roll_ma.envs.team_hooks import default_post_process, default_pre_process, load_hooks

    if not agent.process:
        return []
    key = f"agents[{i}].process"
    try:
        hooks = load_hooks(agent)
    except Exception as err:  # noqa: BLE001 - importing the user's file ran its code
        return [f"{key}: {err}" if isinstance(err, ValueError) else
                f"{key}: importing {agent.process} failed: {type(err).__name__}: {err}"]
    out = []
    for name, fn, default in (("pre_process", hooks.pre, default_pre_process),
                              ("post_process", hooks.post, default_post_process)):
        if fn is default:
            continue
        args, setting = HOOK_CALLS[name]
        why = call_problem(fn, args, dict(getattr(agent, setting)), want_async=False)
        if why:
            out.append(f"{key}: {name} of {hooks.source} {why}; roll_ma calls {name}({', '.join(args)}, "
                       f"**{setting}) and expects a list of token ids")
    return out


def _task_problems(cfg: RunConfig) -> list[str]:
    from roll_ma.envs.team import load_task_class

    try:
        cls = load_task_class(cfg.env.path)
    except Exception as err:  # noqa: BLE001 - importing the user's file ran its code
        return [f"env.path: {err}"]
    out = []
    for name, args in TASK_CALLS.items():
        raw = inspect.getattr_static(cls, name, None)
        fn = getattr(cls, name)
        why = call_problem(fn, args, {}, has_self=not isinstance(raw, (staticmethod, classmethod)))
        if why:
            out.append(f"env.path: {cls.__name__}.{name} {why}; a task has reset(problem) -> obs and "
                       "step(actions, ground_truth) -> (obs, reward, done)")
    return out


def _workflow_problems(cfg: RunConfig) -> list[str]:
    from roll_ma.workflows.lookup import FORM_HINT, is_workflow_class, load_workflow

    try:
        flow = load_workflow(cfg.env.workflow)
    except Exception as err:  # noqa: BLE001 - importing the user's file ran its code
        return [f"env.workflow: {err}" if isinstance(err, ValueError) else
                f"env.workflow: importing {cfg.env.workflow} failed: {type(err).__name__}: {err}"]
    extras = {a: None for a in flow.takes}
    settings = dict(cfg.env.kwargs)
    out = []
    if is_workflow_class(flow.target):
        why = call_problem(flow.target, (), settings)
        if why:
            out.append(f"env.workflow: {flow.target.__name__}({', '.join(settings)}) with env.kwargs: its "
                       f"constructor {why}")
        why = call_problem(flow.target.run, ("task", "agents"), extras, has_self=True, want_async=True)
        where = f"{flow.target.__name__}.run"
    else:
        why = call_problem(flow.target, ("task", "agents"), {**settings, **extras}, want_async=True)
        where = flow.target.__name__
    if why:
        out.append(f"env.workflow: {where} in {flow.file or flow.spec} {why}; {FORM_HINT}")
    return out
