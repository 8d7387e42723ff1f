"""Pre-flight probes of what a config names besides data and checkpoints: the model's tokenizer and config,
hook and workflow signatures, and Ray's auth mode against the cluster's (the decision; the probe of a live
cluster is in tests/e2e/test_ray_token_auth.py)."""

from __future__ import annotations

import shutil

import pytest

from roll_ma.errors import PreflightError
from roll_ma.models.builtin import ASSETS
from roll_ma.preflight import run_preflight
from roll_ma.preflight.config_loader import load_config
from roll_ma.preflight.ray_auth import ClusterAuth, LocalAuth, auth_problems


def problems_of(cfg) -> list[str]:
    with pytest.raises(PreflightError) as err:
        run_preflight(cfg)
    return err.value.problems


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def model_without_tokenizer(tmp_path):
    """The built-in model's config and weights, without its tokenizer files."""
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(ASSETS / "tiny_model" / name, model / name)
    return model


def test_a_model_dir_without_tokenizer_files_names_the_tokenizer_and_tokenizer_path(tmp_path):
    model = model_without_tokenizer(tmp_path)
    out = f"trainer.output_dir={tmp_path / 'out'}"
    (problem,) = problems_of(load_config("math_selfplay_tiny", overrides=[f"model.path={model}", out]))
    assert problem == (
        f"model.path: the tokenizer loaded from {model} is empty (1 token; it holds no tokenizer files); "
        f"copy the tokenizer files (tokenizer.json, tokenizer_config.json, ...) into {model}, or set "
        "model.tokenizer_path to the directory or hub name of the model's tokenizer"
    )
    # the fix it names works
    fixed = [f"model.path={model}", out, f"model.tokenizer_path={ASSETS / 'tiny_model'}"]
    run_preflight(load_config("math_selfplay_tiny", overrides=fixed))


def test_a_teachers_model_is_probed_too(tmp_path):
    model = model_without_tokenizer(tmp_path)
    found = problems_of(load_config("math_reflection_tiny", overrides=[
        f"teacher.model.path={model}", f"trainer.output_dir={tmp_path / 'out'}"]))
    assert [p.split(":")[0] for p in found] == ["teacher.model.path"]
    assert f"the tokenizer loaded from {model} is empty" in found[0]


def test_a_tokenizer_without_chat_template_is_refused_where_prompts_need_one(tmp_path):
    tok = tmp_path / "tokenizer"
    tok.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ASSETS / "tiny_model" / name, tok / name)
    (problem,) = problems_of(load_config("math_selfplay_tiny", overrides=[
        f"model.tokenizer_path={tok}", f"trainer.output_dir={tmp_path / 'out'}"]))
    assert problem.startswith(
        f"model.tokenizer_path: the tokenizer from {tok} has no chat template, which the env's prompts "
        "(env.name=math_selfplay) needs; use a chat (Instruct) model, or set model.tokenizer_path to a "
        "tokenizer that has one")


def test_a_model_dir_without_config_or_weights(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    found = problems_of(load_config("math_selfplay_tiny", overrides=[
        f"model.path={empty}", f"model.tokenizer_path={ASSETS / 'tiny_model'}",
        f"trainer.output_dir={tmp_path / 'out'}"]))
    (problem,) = found
    assert problem.startswith(f"model.path: {empty} holds no config.json (it is empty); give the model")
    (tmp_path / "empty" / "config.json").write_text((ASSETS / "tiny_model" / "config.json").read_text())
    found = problems_of(load_config("math_selfplay_tiny", overrides=[
        f"model.path={empty}", f"model.tokenizer_path={ASSETS / 'tiny_model'}",
        f"trainer.output_dir={tmp_path / 'out'}"]))
    assert found == [f"model.path: {empty} holds a config.json but no weights (*.safetensors, *.bin); copy "
                     "the model's weight files there"]


def test_a_prompt_hook_with_a_wrong_signature_is_refused(tmp_path):
    hooks = tmp_path / "hooks.py"
    hooks.write_text(
        "def pre_process(prompt_ids, obs_ids, **kwargs):  # forgot the tokenizer\n"
        "    return list(obs_ids) + list(prompt_ids)\n\n"
        "async def post_process(tokenizer, prompt_ids, response_ids, speaker):\n"
        "    return list(prompt_ids) + list(response_ids)\n"
    )
    cfg = load_config("marft_tiny", overrides=[f"agents.0.process={hooks}", f"trainer.output_dir={tmp_path}"])
    assert problems_of(cfg) == [
        f"agents[0].process: pre_process of {hooks} takes (prompt_ids, obs_ids, **kwargs) but is called as "
        "(tokenizer, prompt_ids, obs_ids, system_prompt=...): too many positional arguments; roll_ma calls "
        "pre_process(tokenizer, prompt_ids, obs_ids, **pre_process_kwargs) and expects a list of token ids",
        f"agents[0].process: post_process of {hooks} must be a plain `def` (it is `async def`); roll_ma "
        "calls post_process(tokenizer, prompt_ids, response_ids, **post_process_kwargs) and expects a list "
        "of token ids",
    ]


def test_a_workflow_or_team_task_with_a_wrong_signature_is_refused(tmp_path):
    flows = tmp_path / "flows.py"
    flows.write_text(
        "class Flow:\n"
        "    agent_names = ('analyzer', 'executor', 'verifier')\n"
        "    def __init__(self, max_attempts, show_plan, budget):\n"
        "        pass\n"
        "    async def run(self, task):  # forgot agents\n"
        "        return {}\n"
    )
    cfg = load_config("math_tool_tiny", overrides=[f"env.workflow={flows}:Flow", "~env.tools",
                                                   f"trainer.output_dir={tmp_path}"])
    found = problems_of(cfg)
    assert found == [
        "env.workflow: Flow(max_attempts, show_plan) with env.kwargs: its constructor takes (max_attempts, "
        "show_plan, budget) but is called as (max_attempts=..., show_plan=...): missing a required argument: "
        "'budget'",
        f"env.workflow: Flow.run in {flows} takes (self, task) but is called as (task, agents): too many "
        "positional arguments; a workflow is a class with `async def run(self, task, agents)` or an "
        "`async def f(task, agents)`",
    ]
    task = tmp_path / "task.py"
    task.write_text("class Task:\n    def reset(self):\n        return ''\n"
                    "    def step(self, actions, ground_truth):\n        return '', 0.0, True\n")
    cfg = load_config("marft_tiny", overrides=[f"env.path={task}:Task", f"trainer.output_dir={tmp_path}"])
    assert problems_of(cfg) == [
        "env.path: Task.reset takes (self) but is called as (problem): too many positional arguments; a task "
        "has reset(problem) -> obs and step(actions, ground_truth) -> (obs, reward, done)"
    ]


TOKEN = LocalAuth(mode_var="token", token="t0k", token_path=None, auto=False)
UNSET = LocalAuth(mode_var=None, token=None, token_path=None, auto=False)


def test_token_mode_against_a_cluster_without_auth_says_so_with_the_fix():
    (problem,) = auth_problems("10.0.0.5:6379", TOKEN, ClusterAuth(True, wants_token=False))
    assert problem == (
        "RAY_AUTH_MODE: the Ray cluster at 10.0.0.5:6379 runs without token authentication but "
        "RAY_AUTH_MODE=token is set: the driver would join, then every actor would die 'cancelled before it "
        "started'. Set RAY_AUTH_MODE=disabled for this run (or restart the cluster with token auth: "
        "RAY_AUTH_MODE=token ray start --head ...)"
    )
    # a token in ~/.ray turns token mode on by itself when joining with address auto
    auto = LocalAuth(mode_var=None, token="t0k", token_path=None, auto=True)
    (problem,) = auth_problems("auto", auto, ClusterAuth(True, wants_token=False))
    assert "turns token mode on when joining with address auto" in problem
    assert "Set RAY_AUTH_MODE=disabled" in problem


def test_the_other_auth_mismatches_and_the_good_cases():
    (problem,) = auth_problems("10.0.0.5:6379", UNSET, ClusterAuth(True, wants_token=True))
    assert "requires token authentication but this process joins without a token (RAY_AUTH_MODE is unset)" \
        in problem and "set RAY_AUTH_MODE=token" in problem and "ray get-auth-token" in problem
    refused = ClusterAuth(True, wants_token=True, accepts_our_token=False)
    (problem,) = auth_problems("10.0.0.5:6379", TOKEN, refused)
    assert problem.startswith("RAY_AUTH_TOKEN: the Ray cluster at 10.0.0.5:6379 refuses this process's token")
    (problem,) = auth_problems("10.0.0.5:6379", UNSET, ClusterAuth(False, detail="no answer within 5 s"))
    assert "cannot reach the Ray cluster at 10.0.0.5:6379 (no answer within 5 s)" in problem
    assert auth_problems("h:1", TOKEN, ClusterAuth(True, wants_token=True, accepts_our_token=True)) == []
    assert auth_problems("h:1", UNSET, ClusterAuth(True, wants_token=False)) == []
    disabled = LocalAuth("disabled", "t0k", None, True)  # a token exists but the mode says disabled
    assert auth_problems("h:1", disabled, ClusterAuth(True, wants_token=False)) == []
    assert auth_problems("h:1", TOKEN, ClusterAuth(True)) == []  # an unknown answer: ray.init decides
