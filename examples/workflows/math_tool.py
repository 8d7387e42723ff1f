"""Math with a code-executing agent: analyzer -> executor (its program runs in the python tool) -> verifier.

Config: ``env.workflow: examples/workflows/math_tool.py:MathToolWorkflow`` with three agents named
``analyzer``, ``executor`` and ``verifier`` and ``env.tools: {python: {...}}``. Tasks are
``{"problem", "answer"}`` records (``env.data``: synthetic arithmetic or a local DeepScaleR / GSM8K /
MATH-500 file with its preset).

One episode: the analyzer plans; then up to ``max_attempts`` times the executor writes a program
(its last printed line is its answer; with no program, its ``\\boxed{}`` answer counts), the python
tool runs it, and the verifier judges the attempt, ending the loop with ``Correct``. The agents
decide when to stop; the reference answer only scores them.

Per-agent rewards, as in rLLM's multi-agent math-tool example (whose analyzer gets a constant 0.5,
which GRPO turns into a zero advantage; here it gets the outcome):

- analyzer (trajectory reward, on its single call): 1 if the final answer is right;
- executor (one reward per call): 1 if that attempt's answer is right;
- verifier (one reward per call): 1 if its verdict matches whether the attempt it judged was right.

Every agent sees a transcript that starts ``Problem: <problem>`` followed by one ``<Role>: <text>``
line per earlier message. System prompts are the defaults below unless the agent's
``system_prompt`` is set in the config.
"""

from __future__ import annotations

import asyncio
import re

from roll_ma.envs.math_selfplay import extract_verdict
from roll_ma.envs.math_verification import extract_boxed, get_default_verifier
from roll_ma.workflows import Workflow, WorkflowResult

PROMPTS = {
    "analyzer": "You are the analyzer. Read the problem and write a short plan: what to compute, step by "
    "step, so that a Python program can do it. Do not write code.",
    "executor": "You are the executor. Write a Python program in one ```python block that computes the "
    "answer and prints it as the last line of its output. If you do not write a program, put the final "
    "answer in \\boxed{}.",
    "verifier": "You are the verifier. Check the executor's answer to the problem. End your reply with "
    "the word Correct or Incorrect.",
}
_CODE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:/\d+)?")


def extract_code(text: str) -> str:
    """The first fenced code block of a reply, or ""."""
    match = _CODE.search(text)
    return match.group(1).strip() if match else ""


def answer_from(reply: str, program_output: str | None) -> str | None:
    """The attempt's answer: the program's last printed line when it ran, else the reply's \\boxed{}."""
    if program_output is not None:
        lines = [line.strip() for line in program_output.strip().splitlines() if line.strip()]
        if lines:
            boxed = extract_boxed(lines[-1])
            if boxed is not None:
                return boxed
            numbers = _NUMBER.findall(lines[-1])
            return numbers[-1] if numbers else lines[-1]
    return extract_boxed(reply)


class MathToolWorkflow(Workflow):
    """Analyzer -> executor + python tool -> verifier, with per-agent rewards (module docstring).

    Args:
        max_attempts: Executor attempts at most (each judged by the verifier).
        show_plan: Show the analyzer's plan to the executor and the verifier.
    """

    agent_names = ("analyzer", "executor", "verifier")

    def __init__(self, max_attempts: int = 2, show_plan: bool = True):
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.max_attempts, self.show_plan = int(max_attempts), bool(show_plan)

    async def run(self, task, agents, tools):
        problem, gold = str(task["problem"]), str(task["answer"])
        prompts = {name: agents[name].system_prompt or PROMPTS[name] for name in self.agent_names}
        plan = await agents["analyzer"].generate(_chat(prompts["analyzer"], [f"Problem: {problem}"]))
        transcript = [f"Problem: {problem}"] + ([f"Analyzer: {plan.text.strip()}"] if self.show_plan else [])
        executor_rewards, verifier_rewards, runs, failed_runs = [], [], 0, 0
        correct = False
        for _ in range(self.max_attempts):
            reply = await agents["executor"].generate(_chat(prompts["executor"], transcript))
            transcript.append(f"Executor: {reply.text.strip()}")
            code, output = extract_code(reply.text), None
            if code:
                result = await tools["python"](code=code)
                runs, failed_runs = runs + 1, failed_runs + (not result.ok)
                output = result.output if result.ok else None
                transcript.append(f"Output: {result.observation}")
            answer = answer_from(reply.text, output)
            # why a thread: a symbolic answer may take math_verify up to its time limit
            correct = await asyncio.to_thread(get_default_verifier().is_correct, answer, gold)
            executor_rewards.append(float(correct))
            verdict_reply = await agents["verifier"].generate(
                _chat(prompts["verifier"], [*transcript, f"Answer: {answer}"])
            )
            transcript.append(f"Verifier: {verdict_reply.text.strip()}")
            verdict = extract_verdict(verdict_reply.text)
            verifier_rewards.append(float((verdict == "Correct") == correct))
            if verdict == "Correct":
                break
        return WorkflowResult(
            rewards={"analyzer": float(correct), "executor": executor_rewards, "verifier": verifier_rewards},
            metrics={
                "correct": float(correct),
                "first_attempt_correct": executor_rewards[0],
                "attempts": float(len(executor_rewards)),
                "code_runs": float(runs),
                "code_run_errors": float(failed_runs),
                "verifier_accuracy": sum(verifier_rewards) / len(verifier_rewards),
            },
        )


def _chat(system: str, lines: list[str]) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n".join(lines)}]
