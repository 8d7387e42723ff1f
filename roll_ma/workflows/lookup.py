"""Finding the workflow that ``env.workflow`` names, and calling it the same way whatever its form.

Two spellings: a file, ``path/to/flows.py:MathTool`` (a relative path is looked up from the current
directory, then from the roll_ma checkout, so the shipped ``examples/...`` work from anywhere), or an
importable name, ``my_pkg.flows:MathTool`` / ``my_pkg.flows.MathTool``. The target is a class whose
``run`` is ``async def run(self, task, agents, ...)`` (built once per episode with ``env.kwargs``), or
an ``async def f(task, agents, ...)`` (called with ``env.kwargs`` as keyword arguments). ``run`` may
declare the optional arguments ``tools`` and ``rng``; it gets them only if it does.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard

from roll_ma.registry import absolute_spec, find_file, load_target, names_a_file

OPTIONAL_ARGS = ("tools", "rng")
FORM_HINT = "a workflow is a class with `async def run(self, task, agents)` or an `async def f(task, agents)`"


class WorkflowClass(Protocol):
    """The class form of a workflow: built once per episode with ``env.kwargs``; ``run`` plays it."""

    async def run(self, task: dict, agents: Any, **extras: Any) -> Any: ...


def is_workflow_class(target: Any) -> TypeGuard[type[WorkflowClass]]:
    """Whether ``target`` is the class form (else a function); ``load_workflow`` checks ``run`` is async."""
    return inspect.isclass(target)


@dataclass
class LoadedWorkflow:
    """The resolved target of ``env.workflow``.

    Attributes:
        spec: ``env.workflow`` with a file path made absolute.
        target: The class or the function.
        file: Its source file (failures are located in it), or None.
        settings: Names ``env.kwargs`` may set (None: any, the target takes ``**kwargs``).
        takes: The optional ``run`` arguments it declares (a subset of ``tools``, ``rng``).
        agent_names: The agents it says it calls (``agent_names`` attribute), or ().
    """

    spec: str
    target: Any
    file: str | None
    settings: frozenset[str] | None
    takes: frozenset[str]
    agent_names: tuple[str, ...]

    def instance(self, kwargs: dict[str, Any]) -> Callable[..., Awaitable[Any]]:
        """What to call for one episode: ``call(task, agents, **extras)``."""
        if is_workflow_class(self.target):
            return self.target(**kwargs).run
        fn = self.target

        async def call(task: dict, agents: Any, **extras: Any) -> Any:
            return await fn(task, agents, **kwargs, **extras)

        return call


def with_absolute_files(cfg: Any) -> Any:
    """``cfg`` with every user file it names made absolute (a relative one means the driver's directory,
    and Ray actors may run elsewhere): the plug points ``env.name``, ``env.workflow``, ``env.path``,
    ``env.tools.<name>.tool``, ``algorithm.advantage``, ``algorithm.policy_loss``, ``train.strategy``,
    ``rollout.backend`` and ``teacher.rollout.backend`` as 'file.py:Name', and the agents' ``process`` hook
    files. A file that is not found stays as written: the config's checks report it under its key."""
    import dataclasses

    def spec(value: str | None) -> str | None:
        try:
            return absolute_spec(value) if value else value
        except ValueError:
            return value

    def hook_file(value: str | None) -> str | None:  # a dotted module stays as it is
        return find_file(value) if value and names_a_file(value) else value

    def tool(settings: Any) -> Any:
        if not isinstance(settings, dict) or not isinstance(settings.get("tool"), str):
            return settings
        return {**settings, "tool": spec(settings["tool"])}

    env = dataclasses.replace(cfg.env, name=spec(cfg.env.name), workflow=spec(cfg.env.workflow),
                              path=spec(cfg.env.path),
                              tools={name: tool(settings) for name, settings in cfg.env.tools.items()})
    algorithm = dataclasses.replace(cfg.algorithm, advantage=spec(cfg.algorithm.advantage),
                                    policy_loss=spec(cfg.algorithm.policy_loss))
    agents = [dataclasses.replace(a, process=hook_file(a.process)) for a in cfg.agents]
    train = dataclasses.replace(cfg.train, strategy=spec(cfg.train.strategy))
    rollout = dataclasses.replace(cfg.rollout, backend=spec(cfg.rollout.backend))
    teacher = dataclasses.replace(cfg.teacher, rollout=dataclasses.replace(
        cfg.teacher.rollout, backend=spec(cfg.teacher.rollout.backend)))
    return dataclasses.replace(cfg, env=env, algorithm=algorithm, agents=agents, train=train, rollout=rollout,
                               teacher=teacher)


def load_workflow(spec: str | None) -> LoadedWorkflow:
    """Import what ``spec`` names and check its form; ValueError says what is wrong and how to fix it
    (also when ``env.workflow`` is unset: None)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"must be 'path/to/file.py:Name' or 'pkg.module:Name', got {spec!r}")
    spec = absolute_spec(spec)
    try:
        module, target = load_target(spec)
    except ValueError as err:
        raise ValueError(f"{spec!r}: {err}") from err
    run = target.run if is_workflow_class(target) else target
    if not inspect.iscoroutinefunction(run):
        raise ValueError(f"{spec!r} is not a workflow: {FORM_HINT}")
    params = inspect.signature(run).parameters
    any_kw = any(p.kind == p.VAR_KEYWORD for p in params.values())
    takes = frozenset(a for a in OPTIONAL_ARGS if a in params or any_kw)
    if is_workflow_class(target):
        settings = frozenset() if target.__init__ is object.__init__ else keyword_names(target.__init__, 0)
    else:
        settings = keyword_names(target, skip=2)  # after (task, agents)
    settings = settings - set(OPTIONAL_ARGS) if settings is not None else None
    file = getattr(module, "__file__", None)
    return LoadedWorkflow(
        spec, target, file, settings, takes, tuple(getattr(target, "agent_names", ()) or ())
    )


def keyword_names(fn: Any, skip: int) -> frozenset[str] | None:
    """Names a callable accepts by keyword (skipping ``self`` and the first ``skip`` positionals); None when
    it takes ``**kwargs`` (any name) or its signature cannot be read."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_KEYWORD for p in params):
        return None
    if params and params[0].name == "self":
        params = params[1:]
    params = params[skip:]
    return frozenset(p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
