"""The marft team env and per-agent prompt hooks: what hooks receive and return, tasks from files, errors."""

from __future__ import annotations

import textwrap

import pytest

from roll_ma.config.schema import AgentConfig, EnvConfig, ModelConfig, RolloutConfig, RunConfig

HOOKS = '''
def pre_process(tokenizer, prompt_ids, obs_ids, marker):
    text = tokenizer.decode(obs_ids) + tokenizer.decode(prompt_ids) + marker
    return tokenizer.encode(text, add_special_tokens=False)


def post_process(tokenizer, prompt_ids, response_ids, tag):
    return list(prompt_ids) + tokenizer.encode(tag, add_special_tokens=False) + list(response_ids)
'''

TASK = '''
class TwoRounds:
    """Reward 1 when the round's last answer contains a 1; done after two rounds."""

    def __init__(self, bad=None):
        self.bad, self.rounds = bad, 0

    def reset(self, problem):
        self.rounds = 0
        return "Problem: " + problem["problem"]

    def step(self, actions, ground_truth):
        self.rounds += 1
        if self.bad == "type":
            return "obs", "one", False
        if self.bad == "raise":
            raise KeyError("no such answer")
        return "\\nAgain: ", float("1" in list(actions.values())[-1]), self.rounds >= 2
'''


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("team")
    (root / "hooks.py").write_text(HOOKS)
    (root / "task.py").write_text(TASK)
    (root / "bad_pre.py").write_text(textwrap.dedent('''
        def pre_process(tokenizer, prompt_ids, obs_ids):
            return "not ids"
    '''))
    (root / "bad_post.py").write_text(textwrap.dedent('''
        def post_process(tokenizer, prompt_ids, response_ids):
            raise ZeroDivisionError("boom")
    '''))
    (root / "far_ids.py").write_text(textwrap.dedent('''
        def pre_process(tokenizer, prompt_ids, obs_ids):
            return list(obs_ids) + [100000]
    '''))
    return root


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from roll_ma.models.loading import load_tokenizer

    return load_tokenizer(ModelConfig(path=tiny_model_dir))


def _agents(files, process=True):
    hooks = str(files / "hooks.py") if process else None
    kw = {"pre_process_kwargs": {"marker": " MARK"}, "post_process_kwargs": {"tag": " said"}}
    kw = kw if process else {}
    return [AgentConfig(name="reasoner", process=hooks, **kw),
            AgentConfig(name="actor", process=hooks, **kw)]


def _env(tokenizer, agents, **kwargs):
    from roll_ma.envs.team import TeamEnv

    return TeamEnv(agent_configs=agents, tokenizer=tokenizer, **kwargs)


def test_hooks_build_each_agents_prompt_from_context_and_observation(files, tokenizer):
    # a budget of 3 rounds: the episode ends after 2 because the task says done
    env = _env(tokenizer, _agents(files), task_path=f"{files / 'task.py'}:TwoRounds",
               max_assistant_turns=6)
    turn = env.reset(0, problem={"problem": "2+3", "answer": "5"})
    # reasoner: pre_process(obs="Problem: 2+3", context=[]) + marker
    assert turn.agent == "reasoner" and tokenizer.decode(turn.prompt_ids) == "Problem: 2+3 MARK"
    result = env.step("think", response_ids=tokenizer.encode("think", add_special_tokens=False))
    assert result.rewards == [0.0, 0.0] and not result.done
    # actor: the context is what post_process left: tag + the reasoner's response
    assert tokenizer.decode(result.next_turn.prompt_ids) == "Problem: 2+3 saidthink MARK"
    result = env.step("1")
    assert result.rewards == [0.0, 1.0] and not result.done  # the round's last agent is rewarded
    assert "Again: " in tokenizer.decode(result.next_turn.prompt_ids)  # the task's next observation
    env.step("x")
    result = env.step("0")
    assert result.done and result.rewards == [0.0, 0.0]
    assert env.episode_metrics()["rounds"] == 2.0


def test_obs_with_env_false_hides_the_observation(files, tokenizer):
    agents = _agents(files)
    agents[1].obs_with_env = False
    env = _env(tokenizer, agents)
    env.reset(0, problem={"problem": "2+3", "answer": "5"})
    result = env.step("think", response_ids=tokenizer.encode("think", add_special_tokens=False))
    assert tokenizer.decode(result.next_turn.prompt_ids) == " saidthink MARK"


def test_default_hooks_chat_template_the_observation(files, tokenizer):
    from roll_ma.envs.prompts import chat_prompt_ids

    env = _env(tokenizer, [AgentConfig(name="solo", system_prompt="Be brief.")])
    turn = env.reset(0, problem={"problem": "1+1", "answer": "2"})
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Problem: 1+1"}]
    assert turn.prompt_ids == chat_prompt_ids(tokenizer, messages)
    result = env.step("\\boxed{2}")
    assert result.done and result.rewards == [1.0]  # the built-in math task grades the last answer


def test_a_hook_marker_shows_up_in_the_generated_prompt(files, tiny_model_dir):
    from roll_ma.config.schema import LoraConfig
    from roll_ma.workers.env_worker import EnvWorker, EpisodeSpec
    from roll_ma.workers.rollout_worker import RolloutWorker
    from roll_ma.workers.worker_specs import EnvWorkerSpec, RolloutWorkerSpec

    agents = _agents(files)
    rollout = RolloutWorker("rollout", spec=RolloutWorkerSpec(
        model=ModelConfig(path=tiny_model_dir), lora=LoraConfig(rank=4), agents=tuple(agents),
        rollout=RolloutConfig(max_new_tokens=6, micro_batch_size=8), seed=0))
    rollout.init_model()
    worker = EnvWorker("env", spec=EnvWorkerSpec(
        env=EnvConfig(name="marft"), model=ModelConfig(path=tiny_model_dir), agents=tuple(agents),
        seats=("reasoner", "actor"), seed=0, action_choices=False))
    specs = [[EpisodeSpec(f"e{k}", "g", k, {"problem": "2+3", "answer": "5"}) for k in range(2)]]
    batch = worker.run_episodes(rollout, specs, step=1)
    assert len(batch) == 4 and sorted(batch.non_tensor["agent_id"].tolist()) == [0, 0, 1, 1]
    width = batch.batch["prompts"].shape[1]
    for i in range(len(batch)):
        real = batch.batch["attention_mask"][i, :width].bool()
        prompt = worker.tokenizer.decode(batch.batch["prompts"][i][real].tolist())
        assert prompt.endswith(" MARK")
        if batch.non_tensor["agent_id"][i] == 1:  # the actor reads the reasoner's response after the tag
            reasoner = [j for j in range(len(batch)) if batch.non_tensor["episode_id"][j]
                        == batch.non_tensor["episode_id"][i] and batch.non_tensor["agent_id"][j] == 0][0]
            said = worker.tokenizer.decode(batch.batch["responses"][reasoner][
                batch.batch["response_mask"][reasoner].bool()].tolist())
            assert prompt.startswith("Problem: 2+3 said" + said)


def test_bad_hooks_stop_the_run_naming_file_function_and_value(files, tokenizer):
    from roll_ma.envs.team_hooks import HookError

    bad_pre = [AgentConfig(name="reasoner", process=str(files / "bad_pre.py"))]
    with pytest.raises(HookError) as err:
        _env(tokenizer, bad_pre).reset(0, problem={"problem": "1", "answer": "1"})
    assert str(err.value).splitlines() == [
        f"agent 'reasoner': pre_process of {files / 'bad_pre.py'} returned str 'not ids'; it must return a "
        "list of token ids (ints)",
        f"  where: {files / 'bad_pre.py'}:2 in pre_process",  # the hook's def line: the value came from it
        "  fix: return the prompt this agent generates from as token ids, e.g. tokenizer.encode(text, "
        "add_special_tokens=False); or remove the agent's process to use the default prompt",
    ]
    env = _env(tokenizer, [AgentConfig(name="reasoner", process=str(files / "bad_post.py"))])
    env.reset(0, problem={"problem": "1", "answer": "1"})  # the default pre_process
    with pytest.raises(HookError) as err:
        env.step("x")
    assert str(err.value).splitlines() == [
        f"agent 'reasoner': post_process of {files / 'bad_post.py'} raised ZeroDivisionError: boom",
        f"  where: {files / 'bad_post.py'}:3 in post_process",  # the line that raised
        "  fix: correct post_process at that line (the log file has the full traceback); or remove the "
        "agent's process to use the default prompt",
    ]


def test_a_hook_returning_ids_outside_the_vocabulary_is_named_before_the_model_sees_them(files, tokenizer):
    from roll_ma.envs.team_hooks import HookError

    env = _env(tokenizer, [AgentConfig(name="reasoner", process=str(files / "far_ids.py"))], vocab_size=512)
    with pytest.raises(HookError) as err:
        env.reset(0, problem={"problem": "1", "answer": "1"})
    lines = str(err.value).splitlines()
    n = len(tokenizer.encode("Problem: 1", add_special_tokens=False))  # the observation's ids come first
    assert lines[0] == (f"agent 'reasoner': pre_process of {files / 'far_ids.py'} returned token id 100000 "
                        f"at position {n}, outside the model's vocabulary (ids 0..511)")
    assert lines[1] == f"  where: {files / 'far_ids.py'}:2 in pre_process"
    assert lines[2].startswith("  fix: return ids of the tokenizer the hook is given (tokenizer.encode(text")


def test_the_env_worker_gives_team_envs_the_models_vocabulary(tiny_model_dir):
    from roll_ma.workers.env_worker import EnvWorker
    from roll_ma.workers.worker_specs import EnvWorkerSpec

    worker = EnvWorker("env", spec=EnvWorkerSpec(
        env=EnvConfig(name="marft"), model=ModelConfig(path=tiny_model_dir),
        agents=(AgentConfig(name="solo"),), seats=("solo",), seed=0, action_choices=False))
    from transformers import AutoConfig

    assert worker._vocab_size == AutoConfig.from_pretrained(tiny_model_dir).vocab_size


@pytest.mark.parametrize("bad, what, where", [
    ("type", "step() returned ('obs', 'one', False); it must return (obs: str, reward: float, done: bool)",
     "in step"),
    ("raise", "step() raised KeyError: 'no such answer'", "in step"),
])
def test_bad_task_stops_the_run_naming_file_and_value(files, tokenizer, bad, what, where):
    from roll_ma.envs.team import TaskError

    spec = f"{files / 'task.py'}:TwoRounds"
    env = _env(tokenizer, _agents(files, process=False), task_path=spec, bad=bad)
    env.reset(0, problem={"problem": "1", "answer": "1"})
    env.step("a")
    with pytest.raises(TaskError) as err:
        env.step("b")
    lines = str(err.value).splitlines()
    assert lines[0] == f"the task {spec} (env.path): {what}"
    source = (files / "task.py").read_text().splitlines()
    line = (next(i for i, t in enumerate(source, 1) if "raise KeyError" in t) if bad == "raise"
            else next(i for i, t in enumerate(source, 1) if "def step" in t))
    assert lines[1] == f"  where: {files / 'task.py'}:{line} {where}"
    assert lines[2].startswith("  fix: ") and "step" in lines[2] and len(lines) == 3


def test_missing_hook_file_or_task_is_refused_before_actors_start(files):
    from roll_ma.preflight.validate import validate

    cfg = RunConfig(agents=[AgentConfig(name="reasoner", process=str(files / "nope.py")),
                            AgentConfig(name="actor", process=str(files / "hooks.py"),
                                        pre_process_kwargs={"colour": 1})],
                    env=EnvConfig(name="marft", path=f"{files / 'task.py'}:Missing", max_assistant_turns=3))
    problems = {p.key: p.message for p in validate(cfg)}
    assert "nope.py" in problems["agents[0].process"]
    assert "colour" in problems["agents[1].process"]
    assert "has no 'Missing'" in problems["env.path"]
    assert "multiple of the team size 2" in problems["env.max_assistant_turns"]
    dotted = RunConfig(agents=[AgentConfig(name="solo", process="no_such_pkg.hooks")],
                       env=EnvConfig(name="marft", path="roll_ma.envs.team_math:MathVerifier"))
    dotted_problems = {p.key: p.message for p in validate(dotted)}
    assert "cannot import 'no_such_pkg.hooks'" in dotted_problems["agents[0].process"]
    assert "MathVerifier in" in dotted_problems["env.path"]
    assert "has no reset / step" in dotted_problems["env.path"]
    # hooks need the team env
    plain = RunConfig(agents=[AgentConfig(name="solver", process=str(files / "hooks.py"))])
    assert "agents[0].process" in {p.key for p in validate(plain)}


def test_gae_refuses_what_it_cannot_take():
    from roll_ma.config.schema import AlgorithmConfig, CriticConfig, StudyConfig, TrainConfig
    from roll_ma.preflight.validate import validate

    def refused(**sections):
        cfg = RunConfig(algorithm=AlgorithmConfig(advantage="gae"), **sections)
        out: dict[str, str] = {}
        for p in validate(cfg, check_env=False):
            out[p.key] = out.get(p.key, "") + p.message + "\n"
        return out

    assert "advantage=gae" in refused(rollout=RolloutConfig(max_staleness=1))["rollout.max_staleness"]
    assert "advantage=gae" in refused(train=TrainConfig(objective="sft"))["train.objective"]
    finetune = TrainConfig(full_finetune=True, strategy="deepspeed_train")
    assert "advantage=gae" in refused(train=finetune)["train.full_finetune"]
    assert "joint search" in refused(study=StudyConfig(joint_search_every=5))["study.joint_search_every"]
    groups = refused(agents=[AgentConfig(name="a"), AgentConfig(name="b")],
                     critic=CriticConfig(groups=[["a", "c"], ["a"]]))
    assert "'c' is not an agent" in groups["critic.groups[0]"]
    assert "'a' is in two critic groups" in groups["critic.groups[1]"]
    assert "critic.share=true" in refused(critic=CriticConfig(share=False, groups=[["a"]]))["critic.groups"]
    assert refused() == {}  # the plain gae config is fine
