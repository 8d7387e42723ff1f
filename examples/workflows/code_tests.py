"""A code task with three agents: a generator writes a function, a test writer tests it, a refiner fixes it.

Config: ``env.workflow: examples/workflows/code_tests.py:CodeTestsWorkflow`` with agents ``generator``,
``test_writer`` and ``refiner``, ``env.tools: {python: {...}}`` and tasks with ``problem``,
``entry_point``, ``solution`` (a reference program) and ``tests`` (hidden asserts):
``env.data.source: builtin:code_tasks`` (20 small tasks, ``roll_ma/data/code_tasks.py``) or a local
.jsonl with those fields.

One episode: the generator and the test writer work at once (two calls in the same tick); the
python tool runs the hidden tests on the program, the writer's tests on the reference solution (are
they right?) and on the program (do they find its bugs?). When the writer's tests fail on the
program, the refiner sees the program and the failures and writes a new one. Rewards, all from
running tests:

- generator (one call): the share of hidden tests its program passes;
- test_writer (one call): 0.5 x the share of its asserts that hold for the reference solution
  + 0.5 if its tests' verdict on the program (all pass or not) agrees with the hidden tests'
  (0 when it wrote no assert);
- refiner (one call, only when it ran): the share of hidden tests its program passes.

Metrics: ``pass_rate`` / ``solved`` of the final program (the refined one when the refiner ran),
``generator_pass_rate``, ``tests_valid``, ``tests_agree``, ``refined``, ``refine_gain``.
"""

from __future__ import annotations

import asyncio
import re
import secrets

from roll_ma.workflows import Workflow, WorkflowResult

PROMPTS = {
    "generator": "You are the generator. Write the requested Python function in one ```python block.",
    "test_writer": "You are the test writer. Write tests for the requested function in one ```python block: "
    "one assert per line, e.g. assert f(2) == 4. Do not write the function.",
    "refiner": "You are the refiner. The program below fails some tests. Write a corrected program in one "
    "```python block.",
}
_CODE = re.compile(r"```(?:python|py)?\s*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str:
    """The first fenced code block of a reply, or ""."""
    match = _CODE.search(text)
    return match.group(1).strip() if match else ""


def extract_asserts(text: str, limit: int) -> list[str]:
    """The one-line ``assert`` statements of a reply's code block (or of the reply), at most ``limit``."""
    body = extract_code(text) or text
    return [line.strip() for line in body.splitlines() if line.strip().startswith("assert ")][:limit]


def build_test_script(program: str, tests: list[str], marker: str) -> str:
    """A script that runs ``program`` and then each test, printing failures and ``<marker> passed total``.

    The program is compiled inside the script, so a syntax error counts as every test failed rather
    than hiding the summary; the marker is random per run, so a program cannot print a fake summary.
    """
    return (
        f"_tests = {tests!r}\n_passed = 0\n"
        "try:\n"
        f"    exec(compile({program!r}, 'program.py', 'exec'), globals())\n"
        "except BaseException as _err:\n"
        "    print('PROGRAM ERROR:', type(_err).__name__, _err)\n"
        "    _tests_to_run = []\n"
        "else:\n"
        "    _tests_to_run = _tests\n"
        "for _src in _tests_to_run:\n"
        "    try:\n"
        "        exec(_src, globals())\n"
        "        _passed += 1\n"
        "    except BaseException as _err:\n"
        "        print('FAILED:', _src, '->', type(_err).__name__, _err)\n"
        f"print({marker!r}, _passed, len(_tests))\n"
    )


async def run_tests(tools, program: str, tests: list[str]) -> tuple[int, int, str]:
    """(passed, total, report) of ``tests`` against ``program`` in the python tool; a crash or a limit
    counts as nothing passed."""
    if not tests:
        return 0, 0, "no tests"
    marker = f"SUMMARY-{secrets.token_hex(8)}"
    result = await tools["python"](code=build_test_script(program, tests, marker))
    lines = result.output.splitlines()
    summary = [line for line in lines if line.startswith(marker + " ")]
    report = "\n".join(line for line in lines if not line.startswith(marker))
    if not result.ok or not summary:
        return 0, len(tests), (report + "\n" + (result.error or "no summary")).strip()
    passed, total = (int(x) for x in summary[-1].split()[1:3])
    return passed, total, report or "all tests passed"


class CodeTestsWorkflow(Workflow):
    """Generator + test writer (in parallel) -> tests run -> refiner; rewards from tests (module docstring).

    Args:
        max_tests: At most this many of the test writer's asserts are used.
    """

    agent_names = ("generator", "test_writer", "refiner")

    def __init__(self, max_tests: int = 8):
        self.max_tests = int(max_tests)

    async def run(self, task, agents, tools):
        spec, hidden, reference = str(task["problem"]), list(task["tests"]), str(task["solution"])
        prompts = {name: agents[name].system_prompt or PROMPTS[name] for name in self.agent_names}
        program_reply, tests_reply = await asyncio.gather(
            agents["generator"].generate(_chat(prompts["generator"], f"Task: {spec}")),
            agents["test_writer"].generate(_chat(prompts["test_writer"], f"Task: {spec}")),
        )
        program = extract_code(program_reply.text)
        tests = extract_asserts(tests_reply.text, self.max_tests)
        (h_pass, h_total, _), (v_pass, v_total, _), (t_pass, t_total, report) = await asyncio.gather(
            run_tests(tools, program, hidden),
            run_tests(tools, reference, tests),
            run_tests(tools, program, tests),
        )
        generator_rate = h_pass / h_total
        program_right, tests_say_right = h_pass == h_total, t_total > 0 and t_pass == t_total
        valid = v_pass / v_total if v_total else 0.0
        agree = float(program_right == tests_say_right) if tests else 0.0
        rewards = {"generator": generator_rate, "test_writer": 0.5 * valid + 0.5 * agree}
        final_rate, refined = generator_rate, False
        if tests and not tests_say_right:
            fix_reply = await agents["refiner"].generate(
                _chat(prompts["refiner"], f"Task: {spec}\nProgram:\n{program}\nTest results:\n{report}")
            )
            r_pass, r_total, _ = await run_tests(tools, extract_code(fix_reply.text), hidden)
            final_rate, refined = r_pass / r_total, True
            rewards["refiner"] = final_rate
        return WorkflowResult(
            rewards=rewards,
            metrics={
                "pass_rate": final_rate,
                "solved": float(final_rate == 1.0),
                "generator_pass_rate": generator_rate,
                "tests_written": float(len(tests)),
                "tests_valid": valid,
                "tests_agree": agree,
                "refined": float(refined),
                "refine_gain": final_rate - generator_rate if refined else 0.0,
            },
        )


def _chat(system: str, user: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]
