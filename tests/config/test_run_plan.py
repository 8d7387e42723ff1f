"""The run plan says what each shipped example run does; no module but the plan and the registries reads
``algorithm.advantage`` / ``train.objective`` strings for what kind of run they make."""

import re
from pathlib import Path

from example_configs import example_configs

from roll_ma.config.compose import compose_raw, type_config
from roll_ma.config.run_plan import RunPlan, run_plan
from roll_ma.preflight.config_loader import load_config

ROOT = Path(__file__).resolve().parents[2]


def _plan(name: str, *overrides: str) -> RunPlan:
    return run_plan(load_config(name, overrides=list(overrides), check_local_gpus=False))


def test_marft_tiny_is_ppo_with_a_critic_that_warms_up_two_steps_and_no_reference():
    plan = _plan("marft_tiny")
    assert plan == RunPlan(rl=True, objectives=("ppo",), uses_critic=True, critic_warmup_steps=2,
                           reference_needed=False, reference_workers=0)
    assert [plan.critic_only(step) for step in (1, 2, 3)] == [True, True, False]


def test_marft_reasoner_actor_reads_the_base_for_its_kl_on_the_train_worker():
    plan = _plan("marft_reasoner_actor")
    assert (plan.rl, plan.uses_critic, plan.critic_warmup_steps) == (True, True, 5)
    assert plan.reference_needed and plan.reference_workers == 0  # reference.mode=train_worker


def test_grpo_runs_have_no_critic_and_a_reference_only_with_a_kl_term():
    tiny = _plan("math_selfplay_tiny")  # kl_coef 0
    assert tiny == RunPlan(rl=True, objectives=("ppo",), uses_critic=False, critic_warmup_steps=0,
                           reference_needed=False, reference_workers=0)
    assert not tiny.critic_only(1)
    hanabi = _plan("tiny_hanabi_selfplay")  # kl_coef 0.05, the base on the train worker
    assert (hanabi.uses_critic, hanabi.reference_needed, hanabi.reference_workers) == (False, True, 0)


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
