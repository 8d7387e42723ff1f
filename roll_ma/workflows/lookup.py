"""Finding the workflow that ``env.workflow`` names, and calling it the same way whatever its form.

Two spellings: a file, ``path/to/flows.py:MathTool`` (a relative path is looked up from the current
directory, then from the roll_ma checkout, so the shipped ``examples/...`` work from anywhere), or an
importable name, ``my_pkg.flows:MathTool`` / ``my_pkg.flows.MathTool``. The target is a class whose
``run`` is ``async def run(self, task, agents, ...)`` (built once per episode with ``env.kwargs``), or
an ``async def f(task, agents, ...)`` (called with ``env.kwargs`` as keyword arguments). ``run`` may
declare the optional arguments ``tools`` and ``rng``; it gets them only if it does.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import sys
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeGuard

OPTIONAL_ARGS = ("tools", "rng")
REPO_ROOT = Path(__file__).resolve().parents[2]
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


def absolute_spec(spec: str) -> str:
    """``env.workflow`` with a relative file path made absolute (Ray actors may run elsewhere)."""
    path, attr = split_file_spec(spec)
    return f"{find_file(path)}:{attr}" if path is not None else spec


def with_absolute_files(cfg: Any) -> Any:
    """``cfg`` with every user file it names made absolute (a relative one means the driver's directory,
    and Ray actors may run elsewhere): ``env.name``, ``env.workflow`` and ``env.path`` as
    'file.py:Name', and the agents' ``process`` hook files."""
    import dataclasses

    def spec(value: str | None) -> str | None:
        return absolute_spec(value) if value else value

    def hook_file(value: str | None) -> str | None:  # a dotted module stays as it is
        return find_file(value) if value and names_a_file(value) else value

    env = dataclasses.replace(cfg.env, name=spec(cfg.env.name), workflow=spec(cfg.env.workflow),
                              path=spec(cfg.env.path))
    agents = [dataclasses.replace(a, process=hook_file(a.process)) for a in cfg.agents]
    return dataclasses.replace(cfg, env=env, agents=agents)


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


def split_file_spec(spec: str) -> tuple[str | None, str]:
    """('path/to/file.py', 'Name') for a file spec, else (None, spec)."""
    head, sep, attr = spec.rpartition(":")
    if sep and head.endswith(".py"):
        return head, attr
    return None, spec


def import_target(spec: str) -> tuple[Any, str]:
    """(module, name) of what ``spec`` names: 'path/to/file.py:Name' (the file found by ``find_file``),
    'pkg.module:Name' or 'pkg.module.Name'. ValueError, without the caller's context, when the spelling
    is wrong, the file is missing or the import fails; whether the module has the name is the caller's."""
    path, attr = split_file_spec(spec)
    if path is not None:
        return import_file(find_file(path)), attr
    module_name, _, attr = spec.partition(":") if ":" in spec else spec.rpartition(".")
    if not module_name or not attr:
        raise ValueError("use 'path/to/file.py:Name' or 'pkg.module:Name'")
    try:
        return importlib.import_module(module_name), attr
    except ImportError as err:
        raise ValueError(f"cannot import {module_name!r} ({err})") from err


def load_target(spec: str) -> tuple[Any, Any]:
    """(module, object) of what ``spec`` names (spellings as ``import_target``); ValueError, without the
    caller's context, also when the module has no such name (naming the closest one it has)."""
    module, attr = import_target(spec)
    target = getattr(module, attr, None)
    if target is None:
        public = sorted(n for n, v in vars(module).items() if not n.startswith("_") and callable(v))
        close = difflib.get_close_matches(attr, public, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{module_location(module)} has no {attr!r}{hint}; it defines {public}")
    return module, target


def module_location(module: Any) -> str:
    """A module's file, or its name when it has none (for messages)."""
    return getattr(module, "__file__", None) or module.__name__


def names_a_file(source: str) -> bool:
    """Whether a hook ``source`` is a file ('path/to/file.py') rather than a dotted module name."""
    return source.endswith(".py") or "/" in source


def import_source(source: str) -> Any:
    """The module ``source`` names: a file 'path/to/file.py' (found by ``find_file``) or an importable
    dotted module; ValueError when neither loads."""
    if names_a_file(source):
        return import_file(find_file(source))
    try:
        return importlib.import_module(source)
    except ImportError as err:
        raise ValueError(f"cannot import {source!r} ({err}); give 'path/to/file.py' or an importable "
                         "module") from err


def find_file(path: str) -> str:
    """The absolute path of ``path``: as given, else from the current directory, then the roll_ma checkout."""
    candidates = [Path(path).expanduser()]
    if not candidates[0].is_absolute():
        candidates = [Path.cwd() / path, REPO_ROOT / path]
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate.resolve())
    places = list(dict.fromkeys(str(c.parent) for c in candidates))
    raise ValueError(
        f"no file {path!r} (looked in {', '.join(places)}); give an absolute path or one relative to "
        "where you start the run"
    )


def import_file(file: str) -> Any:
    """The module of a Python file (imported once per path)."""
    # why a name derived from the path: two workflow files named flows.py must not replace each other
    name = f"roll_ma_workflow_{Path(file).stem}_{zlib.crc32(file.encode()):08x}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, file)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"{file} is not an importable Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # why: dataclasses and pickling look modules up by name
    try:
        module_spec.loader.exec_module(module)
    except Exception:
        del sys.modules[name]
        raise
    return module


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
