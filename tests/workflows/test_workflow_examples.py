"""The shipped workflow examples: per-agent rewards from scripted agents, the built-in tasks, and CPU runs."""

import asyncio
import sys
from pathlib import Path

import pytest
import torch
from scripted import ScriptedRollout, make_worker, specs

from roll_ma.data.code_tasks import CODE_TASKS, code_task_splits
from roll_ma.tracking import read_metrics
from roll_ma.workflows import PythonTool, ToolBox
from roll_ma.workflows.lookup import load_workflow

MATH = "examples/workflows/math_tool.py:MathToolWorkflow"
CODE = "examples/workflows/code_tests.py:CodeTestsWorkflow"
MATH_AGENTS, CODE_AGENTS = ["analyzer", "executor", "verifier"], ["generator", "test_writer", "refiner"]
TOOLS = {"python": {"timeout_s": 60}}  # why generous: only the programs' own limits should matter


def _rewards(batch):
    """(agent_id, reward) of each row in turn order."""
    order = sorted(range(len(batch)), key=lambda i: batch.non_tensor["turn"][i])
    return [(int(batch.non_tensor["agent_id"][i]), float(batch.batch["scores"][i])) for i in order]


def _math_run(executor_replies, verdicts, answer="85"):
    worker = make_worker(MATH, MATH_AGENTS, tools=TOOLS, kwargs={"max_attempts": 2})
    queues = {1: list(executor_replies), 2: list(verdicts)}
    rollout = ScriptedRollout(worker.tokenizer, lambda a, p: "Add them." if a == 0 else queues[a].pop(0))
    batch = worker.run_episodes(rollout, specs([{"problem": "37+48", "answer": answer}]), step=1)
    return batch, batch.meta_info["episodes"][0]["metrics"], rollout


def test_math_tool_rewards_each_agent_for_its_own_part():
    # the program prints the right answer and the verifier agrees: everyone is rewarded, one attempt
    batch, metrics, rollout = _math_run(["```python\nprint(37 + 48)\n```"], ["37+48=85 Correct"])
    assert _rewards(batch) == [(0, 1.0), (1, 1.0), (2, 1.0)]
    assert metrics["correct"] == 1.0 and metrics["code_runs"] == 1.0 and metrics["attempts"] == 1.0
    assert "Output: 85" in rollout.prompts[-1] and "Answer: 85" in rollout.prompts[-1]


def test_math_tool_second_attempt_after_a_right_rejection():
    # attempt 1 prints 84, the verifier rightly says Incorrect; attempt 2 boxes 85 (no program), accepted
    batch, metrics, rollout = _math_run(
        ["```python\nprint(37 + 47)\n```", "\\boxed{85}"], ["Incorrect", "Correct"]
    )
    # analyzer: the final outcome; executor: per attempt; verifier: per verdict (both right)
    assert _rewards(batch) == [(0, 1.0), (1, 0.0), (2, 1.0), (1, 1.0), (2, 1.0)]
    assert (
        metrics["first_attempt_correct"] == 0.0 and metrics["attempts"] == 2.0 and metrics["code_runs"] == 1.0
    )
    assert "Verifier: Incorrect" in rollout.prompts[3]  # the executor's retry sees the verdict


def test_math_tool_a_verifier_that_accepts_a_wrong_answer_is_punished():
    batch, metrics, _ = _math_run(["```python\nprint(84)\n```"], ["Correct"])
    assert _rewards(batch) == [(0, 0.0), (1, 0.0), (2, 0.0)]
    assert metrics["verifier_accuracy"] == 0.0


def test_math_tool_a_crashing_program_is_an_observation_not_a_crash():
    batch, metrics, rollout = _math_run(
        ["```python\nimport socket\n```", "```python\n1/0\n```"], ["Incorrect", "Incorrect"]
    )
    assert metrics["code_run_errors"] == 2.0 and metrics["correct"] == 0.0
    assert "Error: " in rollout.prompts[2] and "import of socket is blocked" in rollout.prompts[2]
    assert "ZeroDivisionError" in rollout.prompts[4]


def _code_run(program, tests, fix=None, task_id="add"):
    worker = make_worker(CODE, CODE_AGENTS, tools=TOOLS)
    replies = {
        0: f"```python\n{program}\n```",
        1: "```python\n" + "\n".join(tests) + "\n```",
        2: f"```python\n{fix}\n```",
    }
    rollout = ScriptedRollout(worker.tokenizer, lambda a, p: replies[a])
    task = next(t for t in CODE_TASKS if t["id"] == task_id)
    batch = worker.run_episodes(rollout, specs([task]), step=1)
    return batch, batch.meta_info["episodes"][0]["metrics"], rollout


def test_code_task_right_program_and_right_tests_need_no_refiner():
    batch, metrics, rollout = _code_run("def add(a, b):\n    return a + b", ["assert add(1, 2) == 3"])
    assert rollout.calls == [[0, 1]]  # generator and test writer in one tick
    assert _rewards(batch) == [(0, 1.0), (1, 1.0)]
    assert metrics["solved"] == 1.0 and metrics["refined"] == 0.0 and metrics["tests_valid"] == 1.0


def test_code_task_tests_that_catch_a_bug_bring_the_refiner():
    batch, metrics, rollout = _code_run(
        "def add(a, b):\n    return a - b", ["assert add(1, 2) == 3"], fix="def add(a, b):\n    return a + b"
    )
    assert rollout.calls == [[0, 1], [2]]
    # generator: 1 of 4 hidden tests (add(-4, 4) == 0? no: -8; add(0, 0) == 0 passes); writer: valid + agreed
    assert _rewards(batch) == [(0, 0.25), (1, 1.0), (2, 1.0)]
    assert metrics["pass_rate"] == 1.0 and metrics["refine_gain"] == 0.75
    assert "FAILED: assert add(1, 2) == 3" in rollout.prompts[-1]


def test_code_task_wrong_tests_earn_the_writer_nothing():
    # the tests are wrong (they fail on the reference) and reject a right program
    batch, metrics, _ = _code_run(
        "def add(a, b):\n    return a + b", ["assert add(1, 2) == 4"], fix="def add(a, b):\n    return a + b"
    )
    rewards = dict((agent, r) for agent, r in _rewards(batch))
    assert rewards[1] == 0.0 and metrics["tests_valid"] == 0.0 and metrics["tests_agree"] == 0.0


def test_every_builtin_reference_solution_passes_its_hidden_tests():
    module = sys.modules[load_workflow(CODE).target.__module__]
    train, held = code_task_splits()
    assert len(train) == 16 and len(held) == 4
    box = ToolBox({"python": PythonTool(timeout_s=60)})

    async def check_all():
        return await asyncio.gather(*(module.run_tests(box, t["solution"], t["tests"]) for t in CODE_TASKS))

    for task, (passed, total, report) in zip(CODE_TASKS, asyncio.run(check_all())):
        assert passed == total == len(task["tests"]), (task["id"], report)


def _check_run(out, agents, steps):
    rows = [r for r in read_metrics(out / "metrics.jsonl") if r["step"] > 0]  # step 0: the first evaluation
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for r in rows:
        assert r["rollout/stale_rows"] == 0 and r["rollout/env/workflow_failed"] == 0.0
        for name in agents:
            if f"agent/{name}/turns" in r:
                assert r[f"agent/{name}/adapter_version"] == r["step"] - 1
    return rows


@pytest.mark.slow
def test_math_tool_tiny_trains_end_to_end_on_cpu(ray_session, tmp_path):
    import roll_ma

    metrics = roll_ma.train(
        "math_tool_tiny",
        trainer__max_steps=2,
        trainer__eval_every=2,
        trainer__output_dir=str(tmp_path / "out"),
        trainer__progress_bars=False,
        env__group_size=2,
        env__data__num_eval_problems=4,
    )
    rows = _check_run(tmp_path / "out", MATH_AGENTS, 2)
    for r in rows:
        assert (
            r["agent/analyzer/turns"] == 8
            and r["agent/executor/turns"] >= 8
            and r["agent/verifier/turns"] >= 8
        )
        assert r["rollout/episodes"] == 8 and 3 <= r["rollout/episode_turns"] <= 5
    assert "eval/correct" in metrics and "eval/verifier_accuracy" in metrics
    assert metrics["rollout/env/calls"] == rows[-1]["rollout/env/calls"] and metrics["step"] == 2


@pytest.mark.slow
def test_code_tests_tiny_trains_end_to_end_on_cpu(ray_session, tmp_path):
    import roll_ma

    metrics = roll_ma.train(
        "code_tests_tiny", trainer__output_dir=str(tmp_path / "out"), trainer__progress_bars=False
    )
    rows = _check_run(tmp_path / "out", CODE_AGENTS, 2)
    for r in rows:
        assert r["agent/generator/turns"] == 8 and r["agent/test_writer/turns"] == 8
        # the hidden tests always run; the writer's only when it wrote asserts (the tiny model seldom does)
        assert r["rollout/env/tool_calls"] >= 1 and r["rollout/env/tool_timeouts"] == 0
    assert "eval/pass_rate" in metrics and torch.isfinite(torch.tensor(metrics["eval/pass_rate"]))


@pytest.mark.slow
def test_a_raising_workflow_stops_a_real_run_naming_its_file_and_line(ray_session, tmp_path):
    import roll_ma
    from roll_ma.distributed.cluster import WorkerError

    flows = Path(__file__).parents[1] / "helpers" / "flows.py"
    line = next(i for i, text in enumerate(flows.read_text().splitlines(), 1) if "# BROKEN HERE" in text)
    config = {
        "model": {"path": "builtin:tiny", "max_prompt_tokens": 64},
        "agents": [{"name": "solver"}],
        "env": {"workflow": f"{flows}:Broken", "groups_per_step": 2, "group_size": 2},
        "rollout": {"max_new_tokens": 4},
        "reference": {"mode": "none"},
        "trainer": {"max_steps": 2, "output_dir": str(tmp_path / "out"), "progress_bars": False},
    }
    with pytest.raises(WorkerError) as err:  # the env worker's WorkflowError, re-raised by the driver
        roll_ma.train(config)
    lines = str(err.value).splitlines()
    assert lines[0] == (f"env worker rank 0 failed in run_episodes(): workflow {flows}:Broken (env.workflow) "
                        "raised KeyError: 'no such thing'")
    assert lines[1].startswith(f"  where: {flows}:{line} in run (episode ")
    assert "env.on_workflow_error=skip" in lines[2] and len(lines) == 4  # the last: the log file
    assert f'File "{flows}", line {line}, in run' in Path(err.value.log_path).read_text()
    assert (
        not (tmp_path / "out" / "metrics.jsonl").exists()
        or read_metrics(tmp_path / "out" / "metrics.jsonl") == []
    )
