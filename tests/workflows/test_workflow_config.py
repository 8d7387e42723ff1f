"""Workflow configs: env.workflow in both spellings, validation of every problem, roll_ma.train overrides."""

import os
from pathlib import Path

import pytest
import yaml

from roll_ma.config import ConfigError, RunConfig
from roll_ma.preflight.config_loader import load_config
from roll_ma.run import resolve_config
from roll_ma.workflows.lookup import absolute_spec, load_workflow

FLOWS = Path(__file__).parents[1] / "helpers" / "flows.py"  # shared by the workflow and worker tests
TINY = ["math_tool_tiny", "code_tests_tiny"]


def test_a_workflow_loads_from_a_file_path_or_a_dotted_name(monkeypatch):
    monkeypatch.chdir(FLOWS.parent)
    by_file = load_workflow("flows.py:ScriptedTrio")  # relative to the current directory
    assert by_file.file == str(FLOWS) and by_file.spec == f"{FLOWS}:ScriptedTrio"
    assert by_file.agent_names == ("solver", "checker") and by_file.settings == {"checker_reward"}
    assert by_file.takes == frozenset()
    by_name = load_workflow("flows:parallel_flow")
    assert by_name.settings == {"bonus"} and Path(by_name.file) == FLOWS
    assert load_workflow("flows.ToolUser").takes == {"tools"}
    assert absolute_spec("flows.py:ScriptedTrio") == f"{FLOWS}:ScriptedTrio"
    assert absolute_spec("flows:parallel_flow") == "flows:parallel_flow"


def test_a_run_hands_its_actors_absolute_paths_of_every_user_file(monkeypatch):
    from roll_ma.config.schema import AgentConfig, EnvConfig
    from roll_ma.workflows.lookup import with_absolute_files

    monkeypatch.chdir(FLOWS.parent)
    cfg = RunConfig(
        env=EnvConfig(name="flows.py:Env", workflow="flows.py:ScriptedTrio", path="flows.py:Task"),
        agents=[AgentConfig(name="a", process="flows.py"), AgentConfig(name="b", process="my_pkg.hooks")])
    out = with_absolute_files(cfg)
    assert (out.env.name, out.env.workflow, out.env.path) == (f"{FLOWS}:Env", f"{FLOWS}:ScriptedTrio",
                                                               f"{FLOWS}:Task")
    assert [a.process for a in out.agents] == [str(FLOWS), "my_pkg.hooks"]  # a dotted module stays
    builtin = with_absolute_files(RunConfig())
    assert (builtin.env.name, builtin.env.workflow, builtin.env.path) == (RunConfig().env.name, None, None)


def test_shipped_workflow_examples_resolve_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    workflow = load_workflow("examples/workflows/math_tool.py:MathToolWorkflow")
    assert workflow.agent_names == ("analyzer", "executor", "verifier") and workflow.takes == {"tools"}


@pytest.mark.parametrize("name", TINY + ["math_tool_7b", "code_tests_7b"])
def test_the_shipped_workflow_configs_are_valid(name):
    cfg = load_config(name, check_local_gpus=False)
    assert cfg.env.workflow and "python" in cfg.env.tools


def _problems(overrides):
    with pytest.raises(ConfigError) as err:
        load_config("math_tool_tiny", overrides=overrides)
    return {p.key: p.message for p in err.value.problems}


def test_validation_names_every_workflow_problem_at_once():
    problems = _problems(
        [
            "env.kwargs.max_attemps=3",
            "env.tools.pythn={}",
            "env.tools.python.memory_mb=1",
            "agents.2.name=checker",
            "env.data.source=builtin:code_task",
            "env.seats=[analyzer,executor,checker]",
            "study.action_entropy_coef=0.1",
        ]
    )
    assert "did you mean 'max_attempts'" in problems["env.kwargs.max_attemps"]
    assert "did you mean 'python'" in problems["env.tools.pythn"]
    assert "memory_mb=1 is too small" in problems["env.tools.python"]
    assert "calls agents ['verifier']" in problems["agents"]
    assert "did you mean 'code_tasks'" in problems["env.data.source"]
    assert "remove env.seats" in problems["env.seats"]
    assert "study.action_entropy_coef" in problems


@pytest.mark.parametrize(
    "workflow, expected",
    [
        ("examples/workflows/nope.py:X", "no file 'examples/workflows/nope.py'"),
        ("examples/workflows/math_tool.py:MathToolWorkflo", "did you mean 'MathToolWorkflow'"),
        ("roll_ma.workflows.api.as_result", "is not a workflow"),
        ("no_such_package.flows:Flow", "cannot import 'no_such_package.flows'"),
    ],
)
def test_a_bad_workflow_name_is_one_problem_with_the_fix(workflow, expected):
    problems = _problems([f"env.workflow={workflow}"])
    assert expected in problems["env.workflow"]


def test_tools_need_a_workflow_that_takes_them():
    assert (
        "takes no `tools` argument" in _problems(["env.workflow=roll_ma.workflows.api.Workflow"])["env.tools"]
    )


def test_turn_based_envs_refuse_workflow_only_settings():
    with pytest.raises(ConfigError) as err:
        load_config(
            "math_selfplay_tiny", overrides=["env.tools.python={}", "env.data.source=builtin:code_tasks"]
        )
    keys = {p.key for p in err.value.problems}
    assert keys == {"env.tools", "env.data.source"}


def test_train_takes_a_name_a_yaml_a_dict_or_a_runconfig_with_keyword_overrides(tmp_path):
    cfg = resolve_config(
        "math_tool_tiny",
        trainer__max_steps=7,
        agents__1__lr=1e-4,
        env={"group_size": 2, "tools": {"python": {"timeout_s": 2}}},
    )
    assert cfg.trainer.max_steps == 7 and cfg.agents[1].lr == 1e-4 and cfg.agents[0].lr is None
    assert cfg.env.group_size == 2 and cfg.env.groups_per_step == 4  # a dict merges into its section
    assert cfg.env.tools == {"python": {"timeout_s": 2, "memory_mb": 512}}
    assert cfg.name == "math_tool_tiny" and cfg.trainer.output_dir == "outputs/math_tool_tiny"

    path = tmp_path / "mine.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "env": {"workflow": f"{FLOWS}:ScriptedTrio", "groups_per_step": 2},
                "agents": [{"name": "solver"}, {"name": "checker"}],
            }
        )
    )
    from_yaml = resolve_config(str(path), **{"trainer.max_steps": 1})
    assert (
        from_yaml.name == "mine" and from_yaml.trainer.max_steps == 1 and from_yaml.env.groups_per_step == 2
    )
    from_dict = resolve_config(
        {"env": {"workflow": f"{FLOWS}:ScriptedTrio"}, "agents": [{"name": "solver"}, {"name": "checker"}]},
        seed=3,
    )
    assert isinstance(from_dict, RunConfig) and from_dict.seed == 3 and from_dict.name == "run"
    again = resolve_config(from_dict, trainer__max_steps=2)
    assert again.trainer.max_steps == 2 and again.env.workflow == from_dict.env.workflow


def test_train_reports_every_problem_like_the_cli():
    import roll_ma

    with pytest.raises(ConfigError) as err:
        roll_ma.train("math_tool_tiny", trainer__max_steps="oops", trainer__nope=1)
    assert {p.key for p in err.value.problems} == {"trainer.max_steps", "trainer.nope"}
    with pytest.raises(ConfigError, match="no config named 'math_tool_tiney'.*did you mean 'math_tool_tiny'"):
        roll_ma.train("math_tool_tiney")
    with pytest.raises(ConfigError, match="is not a file"):
        roll_ma.train(os.path.join("nowhere", "run.yaml"))


def test_the_readme_config_table_lists_every_shipped_config():
    from roll_ma.config import available_configs

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme[readme.index("## Shipped configs") :].split("\n\n")[1]
    assert all(line.startswith("|") for line in table.splitlines())
    missing = [name for name in available_configs() if f"`{name}`" not in table]
    assert missing == []


def test_a_misspelt_tool_in_a_users_file_is_named_under_its_tool_key_once(tmp_path):
    tools_file = tmp_path / "my_tools.py"
    tools_file.write_text("def calc(expression: str) -> str:\n    return str(eval(expression))\n")
    problems = _problems([f"env.tools.calc={{tool: '{tools_file}:calcc'}}"])
    message = problems["env.tools.calc.tool"]
    assert "has no 'calcc' (did you mean 'calc'?)" in message and "env.tools" not in message
