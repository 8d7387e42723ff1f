"""The run plan says what each shipped example run does; no module but the plan and the registries reads
``algorithm.advantage`` / ``train.objective`` strings for what kind of run they make."""

import dataclasses
import re
from pathlib import Path

from example_configs import example_configs

from roll_ma.config.compose import compose_raw, type_config
from roll_ma.config.run_plan import RunPlan, prompt_sharing, run_plan
from roll_ma.config.schema import AgentConfig, AgentLoraOverride, LoraConfig, RunConfig, TrainConfig
from roll_ma.preflight.config_loader import load_config

ROOT = Path(__file__).resolve().parents[2]


def _plan(name: str, *overrides: str) -> RunPlan:
    return run_plan(load_config(name, overrides=list(overrides), check_local_gpus=False))


def test_marft_tiny_is_ppo_with_a_critic_that_warms_up_two_steps_and_no_reference():
    plan = _plan("marft_tiny")
    assert dataclasses.replace(plan, agents=()) == RunPlan(
        rl=True, objectives=("ppo",), uses_critic=True, critic_warmup_steps=2, reference_needed=False,
        reference_workers=0, step_kind="synchronous", shares_prompts=plan.shares_prompts, agents=(),
        loss_terms=(), advantage_weights=None)
    assert [plan.critic_only(step) for step in (1, 2, 3)] == [True, True, False]


def test_marft_reasoner_actor_reads_the_base_for_its_kl_on_the_train_worker():
    plan = _plan("marft_reasoner_actor")
    assert (plan.rl, plan.uses_critic, plan.critic_warmup_steps) == (True, True, 5)
    assert plan.reference_needed and plan.reference_workers == 0  # reference.mode=train_worker


def test_grpo_runs_have_no_critic_and_a_reference_only_with_a_kl_term():
    tiny = _plan("math_selfplay_tiny")  # kl_coef 0
    assert dataclasses.replace(tiny, agents=()) == RunPlan(
        rl=True, objectives=("ppo",), uses_critic=False, critic_warmup_steps=0, reference_needed=False,
        reference_workers=0, step_kind="synchronous", shares_prompts=tiny.shares_prompts, agents=(),
        loss_terms=(), advantage_weights="balance_reward_classes")  # study.balance_reward_classes
    assert not tiny.critic_only(1)
    hanabi = _plan("tiny_hanabi_selfplay")  # kl_coef 0.05, the base on the train worker
    assert (hanabi.uses_critic, hanabi.reference_needed, hanabi.reference_workers) == (False, True, 0)
    assert hanabi.loss_terms == ("action_entropy",)  # study.action_entropy_coef 0.25: the study's bonus


def test_reference_workers_start_only_when_a_kl_term_reads_them():
    with_kl = _plan("math_selfplay_tiny", "algorithm.kl_coef=0.01", "reference.mode=worker",
                    "reference.num_workers=2")
    assert (with_kl.reference_needed, with_kl.reference_workers) == (True, 2)
    without = _plan("math_selfplay_tiny", "reference.mode=worker", "reference.num_workers=2")
    assert (without.reference_needed, without.reference_workers) == (False, 0)


def test_the_reflection_config_runs_its_phases_in_order():
    plan = _plan("math_reflection_tiny")
    assert not plan.rl and not plan.uses_critic
    assert plan.objectives == ("eval", "sft", "eval", "dpo", "eval")


def test_train_objective_sft_is_a_run_of_one_phase():
    cfg, problems = type_config(compose_raw("math_selfplay_tiny", None, ["train.objective=sft"]), None)
    assert not problems
    plan = run_plan(cfg)
    assert not plan.rl and plan.objectives == ("sft",)


def test_every_example_has_a_plan():
    for name in example_configs():
        plan = _plan(name)
        assert plan.rl == (plan.objectives == ("ppo",)), name


def test_the_step_kind_is_chosen_once_from_staleness_and_the_joint_search():
    assert _plan("math_selfplay_tiny").step_kind == "synchronous"
    assert _plan("math_selfplay_tiny", "rollout.max_staleness=1").step_kind == "streamed"
    assert _plan("math_reflection_tiny").step_kind == "phases"
    joint = RunConfig()
    joint.study.joint_search_every = 2
    assert run_plan(joint).step_kind == "joint_search"
    joint.rollout.max_staleness = 1  # the checks refuse the pair; the plan never raises
    assert run_plan(joint).step_kind == "streamed"


def test_the_agents_carry_their_train_cycle_and_lora_settings():
    cfg = RunConfig(agents=[AgentConfig(name="a"), AgentConfig(name="b", update_every=3, adapter="shared"),
                            AgentConfig(name="c", frozen=True, lora=AgentLoraOverride(rank=4))],
                    train=TrainConfig(train_cycle=2), lora=LoraConfig(rank=16))
    agents = run_plan(cfg).agents
    assert [(a.agent_id, a.name, a.adapter) for a in agents] == [(0, "a", "a"), (1, "b", "shared"),
                                                                  (2, "c", "c")]
    assert [a.update_every for a in agents] == [2, 3, 2]  # train.train_cycle where an agent sets none
    assert [a.lora.rank for a in agents] == [16, 16, 4]  # its overrides on the lora block
    assert [a.frozen for a in agents] == [False, False, True]


def test_the_agents_due_at_a_step_are_one_rule_of_the_plan():
    """Frozen agents never, an agent only on its cycle, none while the critic warms up; the idle agents are
    the rest (the driver scores their rows), the due ones go to the train workers in the update request."""
    cfg = RunConfig(agents=[AgentConfig(name="a"), AgentConfig(name="b", frozen=True),
                            AgentConfig(name="c", update_every=2)])
    plan = run_plan(cfg)
    assert [plan.due_agents(step) for step in (1, 2, 3, 4)] == [(0,), (0, 2), (0,), (0, 2)]
    assert plan.idle_agents(1) == [1, 2] and plan.idle_agents(2) == [1]
    cfg.algorithm.advantage, cfg.critic.warmup_steps = "gae", 2
    warm = run_plan(cfg)
    assert warm.due_agents(2) == () and warm.idle_agents(2) == [0, 1, 2] and warm.due_agents(4) == (0, 2)


def test_prompt_sharing_is_decided_once_for_the_workers():
    packed = RunConfig(train=TrainConfig(remove_padding=True))
    plan = run_plan(packed)
    assert plan.shares_prompts and plan.worker_train_config(packed.train).share_prompt_prefix is True
    assert prompt_sharing(packed.train, None) is plan.shares_prompts  # the rule the checks read
    packed.model.attn_implementation = "sdpa"
    assert run_plan(packed).worker_train_config(packed.train).share_prompt_prefix is False
    assert run_plan(RunConfig()).worker_train_config(TrainConfig()).share_prompt_prefix is False  # padded


# what kind of run a config makes, worked out from its strings: the plan's job alone
NAME = r"""["'](gae|ppo)["']"""
KIND_TEST = re.compile(rf"[=!]=\s*{NAME}|{NAME}\s*[=!]=|\bin\s*[(\[{{][^)\]}}]*{NAME}")
ALLOWED = {"roll_ma/config/run_plan.py"}


def test_no_module_but_the_plan_tests_the_advantage_or_objective_strings():
    found = [
        f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
        for path in sorted((ROOT / "roll_ma").rglob("*.py"))
        if str(path.relative_to(ROOT)) not in ALLOWED
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if KIND_TEST.search(line)
    ]
    assert not found, "read the run plan (roll_ma/config/run_plan.py) instead:\n" + "\n".join(found)
