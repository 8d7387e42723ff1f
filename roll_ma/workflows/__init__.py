"""Multi-agent workflows written as plain async Python, with tools and per-agent rewards.

A workflow receives a task and handles to the agents, calls them in any order
(``await agents["solver"].generate(messages)``), may use tools (``await tools["python"](code=...)``)
and returns per-agent rewards and metrics (``WorkflowResult``). Name it in the config with
``env.workflow: path/to/file.py:Name`` (or ``pkg.module:Name``): the env workers then run many
instances at once, batching their calls into one rollout call per tick (``scheduler``), and every
call becomes a training row of its agent, in the same format as a turn-based env's turns.

Modules: ``api`` (what a workflow sees and returns, the reward-to-row rule), ``loader`` (finding
``env.workflow``), ``episode`` (agent handles, rows, rewards, failures), ``scheduler`` (the ticks),
``tools`` (tool protocol, registry, ToolBox), ``python_tool`` (the sandboxed Python tool).
Nothing here imports Ray.
"""

from roll_ma.workflows.api import Reply, Workflow, WorkflowResult, WorkflowTruncated
from roll_ma.workflows.python_tool import PythonTool
from roll_ma.workflows.tools import Tool, ToolBox, ToolResult, list_tools, make_tool, register_tool

__all__ = [
    "PythonTool",
    "Reply",
    "Tool",
    "ToolBox",
    "ToolResult",
    "Workflow",
    "WorkflowResult",
    "WorkflowTruncated",
    "list_tools",
    "make_tool",
    "register_tool",
]
