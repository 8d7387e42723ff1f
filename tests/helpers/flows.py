"""Workflows and tools of the tests, named by file path or as ``flows:Name`` (this folder is on the path)."""

import asyncio
import threading

from roll_ma.workflows import Tool, ToolResult, Workflow, WorkflowResult


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


class ScriptedTrio(Workflow):
    """solver -> checker -> solver; per-call rewards for the solver, a trajectory reward for the checker."""

    agent_names = ("solver", "checker")

    def __init__(self, checker_reward: float = 0.5):
        self.checker_reward = checker_reward

    async def run(self, task, agents):
        first = await agents["solver"].generate(ask(f"task {task['n']}: first"))
        verdict = await agents["checker"].generate(ask(f"check {first.text}"))
        second = await agents["solver"].generate(ask(f"task {task['n']}: again after {verdict.text}"))
        assert (first.turn, verdict.turn, second.turn) == (0, 1, 2) and (first.index, second.index) == (0, 1)
        return WorkflowResult(
            rewards={"solver": [0.25, 1.0], "checker": self.checker_reward},
            metrics={"n": float(task["n"]), "second_len": float(len(second.text))},
        )


async def parallel_flow(task, agents, bonus: float = 0.0):
    """Both agents at once (one tick), then the solver again; a plain dict as the result."""
    a, b = await asyncio.gather(agents["solver"].generate(ask("a")), agents["checker"].generate(ask("b")))
    c = await agents["solver"].generate(ask(f"{a.text} {b.text}"))
    return {"rewards": {"solver": 1.0 + bonus}, "metrics": {"turn_of_last": float(c.turn)}}


class Flaky(Workflow):
    """Raises on tasks with ``fail`` after one call."""

    async def run(self, task, agents):
        await agents["solver"].generate(ask("hello"))
        if task.get("fail"):
            return 1 / 0  # RAISE HERE
        return WorkflowResult(rewards={"solver": 1.0})


class Chatty(Workflow):
    """Never stops calling: ends at env.max_turns."""

    async def run(self, task, agents):
        while True:
            await agents["solver"].generate(ask("more"))


class BadReturn(Workflow):
    async def run(self, task, agents):
        await agents["solver"].generate(ask("x"))
        return [1.0]


class WrongLength(Workflow):
    async def run(self, task, agents):
        await agents["solver"].generate(ask("x"))
        return WorkflowResult(rewards={"solver": [1.0, 2.0]})


class UnknownAgent(Workflow):
    async def run(self, task, agents):
        await agents["solver"].generate(ask("x"))
        return WorkflowResult(rewards={"critic": 1.0})


class ToolUser(Workflow):
    """Runs a program, calls the solver with its output, then tries a hanging and a crashing tool."""

    async def run(self, task, agents, tools):
        ran = await tools["python"](code=f"print({task['n']} * 7)")
        reply = await agents["solver"].generate(ask(ran.observation))
        hung = await tools["hang"]()
        crashed = await tools["crash"](x=1)
        return WorkflowResult(
            rewards={"solver": float(ran.output.strip() == str(task["n"] * 7))},
            metrics={
                "hang_limit_time": float(hung.limit == "time"),
                "crash_error": float("boom" in crashed.error),
                "reply_len": float(len(reply.text)),
            },
        )


class HangTool(Tool):
    """Blocks far past its time limit (the ToolBox gives up; the thread ends on its own)."""

    name = "hang"

    def __init__(self, timeout_s: float = 0.2):
        self.timeout_s, self.grace_s = timeout_s, 0.1

    def __call__(self) -> ToolResult:
        threading.Event().wait(3.0)
        return ToolResult(ok=True, output="too late")


class CrashTool(Tool):
    name = "crash"

    def __call__(self, x: int) -> ToolResult:
        raise RuntimeError(f"boom {x}")


class Broken(Workflow):
    """Fails in every episode, after one call."""

    async def run(self, task, agents):
        await agents["solver"].generate(ask(task["problem"]))
        raise KeyError("no such thing")  # BROKEN HERE


class WrongName(Workflow):
    async def run(self, task, agents):
        return await agents["critic"].generate(ask("x"))
