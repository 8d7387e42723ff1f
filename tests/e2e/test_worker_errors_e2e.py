"""A failure inside a worker ends a real run as one message: through the CLI (a raising prompt hook, in a
subprocess, output to a pipe) and through ``roll_ma.train`` (a team task whose step() raises)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SMALL = ["trainer.max_steps=1", "env.groups_per_step=2", "env.group_size=2", "env.data.num_eval_problems=2"]


def test_a_raising_hook_ends_the_cli_run_with_one_message_and_a_log(tmp_path):
    hook = tmp_path / "hooks.py"
    hook.write_text(textwrap.dedent('''
        def pre_process(tokenizer, prompt_ids, obs_ids, system_prompt):
            return [1, 2, len(obs_ids) // 0]


        def post_process(tokenizer, prompt_ids, response_ids, speaker):
            return list(prompt_ids) + list(response_ids)
    '''))
    out = tmp_path / "out"
    res = subprocess.run(
        [sys.executable, str(REPO / "start_pipeline.py"), "--config_name", "marft_tiny", *SMALL,
         f"agents.0.process={hook}", f"agents.1.process={hook}", f"trainer.output_dir={out}"],
        capture_output=True, text=True, cwd=REPO, timeout=500, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    printed = res.stdout + res.stderr
    assert res.returncode == 1, printed[-3000:]
    assert "\x1b[" not in printed and "Traceback" not in printed
    lines = res.stderr.strip().splitlines()[-4:]
    assert lines[0] == (f"error: env worker rank 0 failed in run_episodes(): agent 'reasoner': pre_process "
                        f"of {hook} raised ZeroDivisionError: integer division or modulo by zero")
    assert lines[1] == f"  where: {hook}:3 in pre_process"
    assert lines[2] == ("  fix: correct pre_process at that line (the log file has the full traceback); or "
                        "remove the agent's process to use the default prompt")
    log = Path(lines[3].removeprefix("  full traceback: "))
    assert log.parent == out / "logs" and log.is_file()
    body = log.read_text()
    assert "---- traceback in the worker(s) ----" in body and f'File "{hook}", line 3' in body
    assert "roll_ma/envs/team_hooks.py" in body and "ZeroDivisionError" in body


def test_a_raising_task_step_raises_the_typed_error_from_train(ray_session, tmp_path):
    import roll_ma
    from roll_ma.distributed.watchdog import WorkerError

    task = tmp_path / "task.py"
    task.write_text(textwrap.dedent('''
        class Grader:
            def reset(self, problem):
                return "Problem: " + problem["problem"]

            def step(self, actions, ground_truth):
                return "", float(actions["judge"]), True
    '''))
    config = {
        "model": {"path": "builtin:tiny", "max_prompt_tokens": 64},
        "agents": [{"name": "solver"}, {"name": "judge"}],
        "env": {"name": "marft", "path": f"{task}:Grader", "max_assistant_turns": 2, "groups_per_step": 2,
                "group_size": 2, "data": {"source": "synthetic", "num_eval_problems": 2}},
        "rollout": {"max_new_tokens": 4},
        "reference": {"mode": "none"},
        "trainer": {"max_steps": 1, "eval_every": 0, "output_dir": str(tmp_path / "out"),
                    "progress_bars": False},
    }
    with pytest.raises(WorkerError) as err:
        roll_ma.train(config)
    lines = str(err.value).splitlines()
    assert lines[0].startswith(f"env worker rank 0 failed in run_episodes(): the task {task}:Grader "
                               "(env.path): step() raised ValueError: could not convert string to float")
    assert lines[1] == f"  where: {task}:7 in step"
    assert lines[2].startswith("  fix: correct step() at that line (the log file has the full traceback)")
    assert lines[3] == f"  full traceback: {err.value.log_path}" and len(lines) == 4
    assert Path(err.value.log_path).parent == tmp_path / "out" / "logs"
    assert f'File "{task}", line 7, in step' in Path(err.value.log_path).read_text()


def test_a_worker_failing_in_its_constructor_ends_the_cli_run_with_one_message_and_no_ray_dump(tmp_path):
    """An env whose module imports a package the workers lack: the env worker's __init__ raises. The console
    shows our few lines (what, where, fix, log file), as for a failed call; none of Ray's actor-death dump."""
    env_file = tmp_path / "my_env.py"
    env_file.write_text(textwrap.dedent('''
        import os

        from roll_ma.envs.math_selfplay import MathSelfPlayEnv

        if "RANK" in os.environ:  # in a worker process only: the driver's own import works
            import package_only_on_my_laptop  # noqa: F401


        class MyEnv(MathSelfPlayEnv):
            pass
    '''))
    out = tmp_path / "out"
    # the driver is no worker: without the RANK / WORLD_SIZE that in-process DeepSpeed tests leave behind
    dist_vars = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    driver_env = {**{k: v for k, v in os.environ.items() if k not in dist_vars}, "PYTHONUNBUFFERED": "1"}
    res = subprocess.run(
        [sys.executable, str(REPO / "start_pipeline.py"), "--config_name", "math_selfplay_tiny", *SMALL,
         f"env.name={env_file}:MyEnv", f"trainer.output_dir={out}"],
        capture_output=True, text=True, cwd=REPO, timeout=500, env=driver_env,
    )
    printed = res.stdout + res.stderr
    assert res.returncode == 1, printed[-3000:]
    for ray_dump in ("creation task", "Traceback", "ray::", "(EnvWorker pid=", "\x1b["):
        assert ray_dump not in printed, printed[-3000:]
    lines = res.stderr.strip().splitlines()[-4:]  # progress lines (off a terminal) may come before
    assert lines[0] == ("error: env worker rank 0 failed to start (its __init__ raised): "
                        "ModuleNotFoundError: No module named 'package_only_on_my_laptop'")
    assert lines[1] == f"  where: {env_file}:7 in <module>"
    assert lines[2].startswith("  fix: install package_only_on_my_laptop in the Python environment the")
    log = Path(lines[3].removeprefix("  full traceback: "))
    assert log.parent == out / "logs" and log.is_file()
    assert f'File "{env_file}", line 7, in <module>' in log.read_text()
    assert (out / "logs" / "run.log").is_file()  # the workers' output; named on the console's first line
    assert f"the workers' logs go to {out / 'logs' / 'run.log'}" in res.stdout
