"""Tools a workflow may call: a small protocol, a registry, and the per-episode ``ToolBox``.

A tool is a callable object, ``tool(**arguments) -> ToolResult``, synchronous and plain Python (no
Ray). Workflows reach their tools through the ``ToolBox`` they are handed (``await
tools["python"](code=...)``), which runs each call in a thread, so that the tools of many workflow
instances run at once, and turns every way a tool can go wrong into a ``ToolResult`` with
``ok=False`` and an ``error`` the agent can read:

- the tool raises -> ``error = "tool 'x' failed: ValueError: ..."``;
- the tool runs past ``timeout_s + grace_s`` -> ``limit = "time"``; the thread is abandoned (Python
  cannot kill a thread: a tool that may hang forever must enforce its own limit, as ``PythonTool``
  does by killing its subprocess);
- the tool returns something other than a ``ToolResult`` -> its ``str()`` becomes the output.

So a tool never crashes a run. One tool instance serves every episode of an env worker at once:
keep tools stateless or thread-safe.

Built-in: ``python`` (``roll_ma.workflows.python_tool.PythonTool``). Your own (a ``Tool`` subclass or a
function): name it in ``env.tools`` by import path or file (``search: {tool: my_pkg.tools:SearchTool}``,
``{tool: path/to/tools.py:search}``), which every workflow worker imports itself, or register a name with
``@register_tool("name")`` (known only in processes that import the module holding the decorator).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from roll_ma.registry import Registry


@dataclass
class ToolResult:
    """What one tool call gave back.

    Attributes:
        ok: The call did what was asked (a program exited with status 0, within its limits).
        output: What the tool produced (a program's stdout), possibly cut to a size limit.
        error: Why it did not succeed (a traceback's last lines, a limit, an exception), else "".
        limit: The limit that stopped it: "time", "memory", "output", or None.
    """

    ok: bool
    output: str = ""
    error: str = ""
    limit: str | None = None

    @property
    def observation(self) -> str:
        """The text an agent is shown: the output, then the error if any."""
        parts = [self.output.rstrip("\n")] if self.output else []
        if self.error:
            parts.append(f"Error: {self.error}")
        return "\n".join(parts) if parts else "(no output)"

    @classmethod
    def failure(cls, error: str, limit: str | None = None) -> ToolResult:
        return cls(ok=False, error=error, limit=limit)


class Tool:
    """Base of roll_ma tools: ``__call__(**arguments) -> ToolResult``.

    Attributes:
        name: The name workflows use (``tools["python"]``).
        description: One line for prompts.
        timeout_s: How long the tool may take; the ToolBox stops waiting at ``timeout_s + grace_s``.
        grace_s: Slack on top of ``timeout_s`` (a tool that enforces its own limit needs time to
            start and to clean up).
    """

    name: str = "tool"
    description: str = ""
    timeout_s: float = 30.0
    grace_s: float = 5.0

    def __call__(self, **arguments: Any) -> ToolResult:
        raise NotImplementedError


class FunctionTool(Tool):
    """A plain function as a tool: its return value's ``str()`` is the output."""

    def __init__(self, fn: Callable[..., Any], name: str, timeout_s: float = 30.0, description: str = ""):
        self.fn, self.name, self.timeout_s = fn, name, float(timeout_s)
        self.description = description or (inspect.getdoc(fn) or "").split("\n")[0]

    def __call__(self, **arguments: Any) -> ToolResult:
        value = self.fn(**arguments)
        return value if isinstance(value, ToolResult) else ToolResult(ok=True, output=str(value))


def _tool_or_function(obj: Any) -> str | None:
    return None if callable(obj) else f"is a {type(obj).__name__}, not a Tool subclass or a function"


TOOLS: Registry[Any] = Registry(
    "tool",
    "env.tools.<name>.tool",
    "roll_ma.workflows.tools.register_tool",
    builtins={"python": "roll_ma.workflows.python_tool:PythonTool"},
    check=_tool_or_function,
)


def register_tool(name: str) -> Callable[[Any], Any]:
    """Register a ``Tool`` subclass or a plain function under ``name`` (decorator).

    Example:
        @register_tool("lookup")
        def lookup(key: str) -> str: ...
    """
    return TOOLS.register(name)


def _factory(obj: Any, name: str) -> Callable[..., Tool]:
    if isinstance(obj, type) and issubclass(obj, Tool):
        return obj

    def make(timeout_s: float = 30.0, description: str = "") -> Tool:
        return FunctionTool(obj, name, timeout_s, description)

    return make


def list_tools() -> list[str]:
    """Sorted names of every known tool (built-in and registered)."""
    return list(TOOLS.names())


def resolve_tool(spec: str) -> Callable[..., Tool]:
    """The tool factory (a Tool subclass or a function wrapper) for a name, 'pkg.module:Name' or
    'path/to/file.py:Name' (``roll_ma.registry``)."""
    return _factory(TOOLS.get(spec), spec.rsplit(":", 1)[-1].rsplit(".", 1)[-1])


def make_tool(name_or_path: str, **settings: Any) -> Tool:
    """Build a tool from its name or import path with ``settings`` as constructor arguments."""
    return resolve_tool(name_or_path)(**settings)


def build_tools(config: dict[str, dict[str, Any]]) -> dict[str, Tool]:
    """``env.tools`` as tool instances keyed by the name workflows use.

    Each entry is ``name: settings``; ``settings["tool"]`` names the implementation (a registered name
    or an import path; default: ``name``), the other settings go to its constructor:
    ``{python: {timeout_s: 5}, search: {tool: my_pkg.tools:Search, top_k: 3}}``.
    """
    tools = {}
    for name, settings in config.items():
        settings = dict(settings or {})
        tools[name] = make_tool(str(settings.pop("tool", name)), **settings)
    return tools


class ToolBox:
    """The tools of one workflow episode: ``await tools["python"](code=...)`` or ``await tools.call(...)``.

    Every call runs in a thread of ``executor`` (default: the loop's), so the tools of concurrent
    episodes overlap, and never raises for a tool's failure (module docstring). The worker passes an
    executor it shuts down without waiting: a tool thread that never returns must not hold up the run.
    ``activity`` is entered around each call: the scheduler uses it to know that this episode is busy
    and the next generate tick must wait for it. ``stats`` counts calls, errors and timeouts, which
    the worker adds to the episode's metrics.
    """

    def __init__(
        self,
        tools: dict[str, Tool],
        activity: Callable[[], Any] | None = None,
        executor: concurrent.futures.Executor | None = None,
    ):
        self._tools = dict(tools)
        self._activity = activity or contextlib.nullcontext
        self._executor = executor
        self.stats = {"tool_calls": 0, "tool_errors": 0, "tool_timeouts": 0}

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[str]:
        return iter(self._tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __getitem__(self, name: str) -> Callable[..., Any]:
        self._tool(name)

        async def call(**arguments: Any) -> ToolResult:
            return await self.call(name, **arguments)

        return call

    def get(self, name: str) -> Tool | None:
        """The tool instance itself (to read its description), or None."""
        return self._tools.get(name)

    def _tool(self, name: str) -> Tool:
        if name not in self._tools:
            # why a KeyError and not an error observation: asking for a tool that is not configured is a
            # bug in the workflow or the config, not something the agent did
            raise KeyError(
                f"no tool {name!r} in this run; configured tools: {sorted(self._tools) or 'none'} "
                f"(add it under env.tools, e.g. env.tools.{name}: {{}})"
            )
        return self._tools[name]

    async def call(self, name: str, **arguments: Any) -> ToolResult:
        tool = self._tool(name)
        self.stats["tool_calls"] += 1
        wait_s = float(getattr(tool, "timeout_s", 30.0)) + float(getattr(tool, "grace_s", 5.0))
        with self._activity():
            try:
                running = asyncio.get_running_loop().run_in_executor(
                    self._executor, functools.partial(tool, **arguments)
                )
                result = await asyncio.wait_for(running, timeout=wait_s)
            except asyncio.TimeoutError:
                self.stats["tool_timeouts"] += 1
                result = ToolResult.failure(f"tool {name!r} gave no answer within {wait_s:g} s", "time")
            except Exception as err:  # noqa: BLE001 - any failure of a tool is an observation
                result = ToolResult.failure(f"tool {name!r} failed: {type(err).__name__}: {err}")
        if not isinstance(result, ToolResult):
            result = ToolResult(ok=True, output=str(result))
        if not result.ok:
            self.stats["tool_errors"] += 1
        return result
