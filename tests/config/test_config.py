"""Config: Hydra composition, typing, validation that reports every problem, and the launcher."""

import subprocess
import sys
from pathlib import Path

import pytest

from roll_ma.config import ConfigError, available_configs
from roll_ma.preflight import validate as validate_module
from roll_ma.preflight.config_loader import load_config

REPO = Path(__file__).resolve().parents[2]
CPU_CONFIGS = ["math_selfplay_tiny", "tiny_hanabi_selfplay", "math_tool_tiny", "code_tests_tiny"]
GPU_CONFIGS = ["math_selfplay", "hanabi_selfplay", "math_selfplay_7b", "hanabi_selfplay_7b", "math_tool_7b",
               "code_tests_7b"]


def problems_of(name, overrides=(), **kwargs):
    with pytest.raises(ConfigError) as err:
        load_config(name, overrides=list(overrides), **kwargs)
    return [str(p) for p in err.value.problems]


def test_shipped_configs_are_found():
    assert set(CPU_CONFIGS + GPU_CONFIGS) <= set(available_configs())


@pytest.mark.parametrize("name", CPU_CONFIGS)
def test_cpu_configs_validate(name):
    cfg = load_config(name)
    assert cfg.name == name and cfg.rollout.backend == "hf" and cfg.resources.num_gpus == 0
    assert cfg.trainer.output_dir == f"outputs/{name}"  # ${name} interpolation resolved


@pytest.mark.parametrize("name", GPU_CONFIGS)
def test_gpu_configs_only_miss_the_gpu_on_this_machine(name, monkeypatch):
    monkeypatch.setattr(validate_module, "local_gpu_count", lambda: 8)
    cfg = load_config(name)
    assert cfg.rollout.backend == "vllm" and cfg.model.dtype == "bfloat16"
    # the 8-GPU layout from the config's comment is valid too
    load_config(
        name,
        overrides=[
            "resources.num_gpus=8",
            "rollout.num_workers=8",
            "train.num_workers=8",
            "resources.device_mapping.rollout=[0,1,2,3,4,5,6,7]",
            "resources.device_mapping.train=[0,1,2,3,4,5,6,7]",
            "env.num_workers=8",
        ],
    )
    monkeypatch.setattr(validate_module, "local_gpu_count", lambda: 0)
    assert any("asks for 1 GPU but this machine has none" in p for p in problems_of(name))


def test_every_problem_is_reported_at_once():
    found = problems_of(
        "math_selfplay_tiny",
        ["trainer.max_steps=oops", "trainer.nope=1", "trainer.lr=0.1", "rollout.backend=vlm", "lora.rank=0"],
    )
    assert "trainer.max_steps: must be an integer, got str 'oops'" in found
    assert any(p.startswith("trainer.nope: unknown key") for p in found)
    assert "trainer.lr: unknown key (did you mean 'train.lr'?)" in found
    assert any("rollout.backend" in p and "did you mean 'vllm'" in p for p in found)
    assert "lora.rank: must be >= 1, got 0" in found


def test_a_key_of_the_wrong_type_is_not_also_judged_at_its_default():
    # agents=3 is typed as no agents: "needs at least one agent" or "every agent is frozen" would mislead
    assert problems_of("math_selfplay_tiny", ["agents=3"]) == ["agents: must be list of mapping, got int 3"]
    found = problems_of("math_selfplay_tiny", ["agents=[]"])
    assert "agents: needs at least one agent, e.g. agents: [{name: player}]" in found
    assert not any("frozen" in p for p in found)


def test_a_choice_is_taken_with_its_type_and_the_message_says_the_one_meant():
    """0 and 1 are not false and true (Python's 0 == False let share_prompt_prefix=0 through, then act as
    auto), a quoted '1' is not the number 1, and true is no sleep level."""
    found = problems_of("math_selfplay_tiny", ["train.share_prompt_prefix=0", "model.liger_kernel=1",
                                               "rollout.sleep_level='1'", "trainer.resume=AUTO"])
    shared = "train.share_prompt_prefix: must be one of 'auto', true, false, got 0 (did you mean false?)"
    assert shared in found
    assert "model.liger_kernel: must be one of 'auto', true, false, got 1 (did you mean true?)" in found
    assert "rollout.sleep_level: must be one of 0, 1, 'kv_cache', got '1' (did you mean 1?)" in found
    assert "trainer.resume: must be one of 'auto', 'never', got 'AUTO' (did you mean 'auto'?)" in found
    typo = problems_of("math_selfplay_tiny", ["model.liger_kernel=ture"])  # suggested as it is written
    assert typo == [
        "model.liger_kernel: must be one of 'auto', true, false, got 'ture' (did you mean 'true'?)"]
    found = problems_of("math_selfplay_tiny", ["rollout.sleep_level=true"])
    assert found == ["rollout.sleep_level: must be one of 0, 1, 'kv_cache', got True"]
    # a value left out on purpose says why (vLLM's level 2 would break adapter reloads)
    (level2,) = problems_of("math_selfplay_tiny", ["rollout.sleep_level=2"])
    assert level2.startswith("rollout.sleep_level: must be one of 0, 1, 'kv_cache', got 2: vLLM's sleep "
                             "level 2 discards the weights") and "verl #3516" in level2
    cfg = load_config("math_selfplay_tiny",
                      overrides=["train.share_prompt_prefix=false", "rollout.sleep_level=1"])
    assert (cfg.train.share_prompt_prefix, cfg.rollout.sleep_level) == (False, 1)


def test_cross_field_checks():
    found = problems_of("tiny_hanabi_selfplay", ["env.seats=[player_0,player_1,player_0]"])
    assert any("has 2 players but 3 seats" in p for p in found)
    found = problems_of("tiny_hanabi_selfplay", ["env.seats=[player_0,plaer_1]"])
    assert any("'plaer_1' is not an agent (did you mean 'player_1'?)" in p for p in found)
    found = problems_of("math_selfplay_tiny", ["env.groups_per_step=5", "env.num_workers=2"])
    assert any("5 groups cannot be split evenly over env.num_workers=2" in p for p in found)
    found = problems_of("math_selfplay_tiny", ["train.zero_stage=3"])
    assert any(p.startswith("train.zero_stage: ZeRO-3 is not supported") for p in found)
    found = problems_of(
        "math_selfplay_tiny", ["algorithm.kl_coef=0.1"]
    )  # the config sets reference.mode=none
    assert any(p.startswith("algorithm.kl_coef: a KL term needs reference log-probs") for p in found)
    found = problems_of("math_selfplay_tiny", ["study.action_entropy_coef=0.1"])
    assert any(p.startswith("study.action_entropy_coef: math_selfplay answers in free text")
               for p in found)
    load_config("tiny_hanabi_selfplay", overrides=["study.action_entropy_coef=0.1"])  # a game: fine
    found = problems_of("math_selfplay_tiny", ["env.kwargs.roundz=2"])
    assert any("takes no setting 'roundz' (did you mean 'rounds'?)" in p for p in found)
    found = problems_of("math_selfplay_tiny", ["env.show_greedy_moves=true"])
    assert any(p.startswith("env.show_greedy_moves: math_selfplay does not show") for p in found)
    # tiny_hanabi does (without the demo's joint search, whose prompts must not quote the episode)
    sad = ["env.show_greedy_moves=true", "study.joint_search_every=0"]
    load_config("tiny_hanabi_selfplay", overrides=sad)
    found = problems_of("tiny_hanabi_selfplay", ["+env.kwargs.show_greedy_moves=true"])
    assert "env.kwargs.show_greedy_moves: set env.show_greedy_moves instead" in found


def test_game_study_keys_moved_out_of_algorithm_and_the_old_keys_name_the_new_ones(tmp_path):
    from roll_ma.config.schema import MOVED_KEYS, StudyConfig
    from roll_ma.run import resolve_config

    cfg = load_config("tiny_hanabi_selfplay")
    assert cfg.study.joint_search_every == 100 and cfg.study.action_entropy_coef == 0.25
    assert load_config("math_selfplay_tiny").study.balance_reward_classes
    assert set(MOVED_KEYS.values()) == {f"study.{f}" for f in StudyConfig.__dataclass_fields__}
    # an override, a yaml key and the Python entry all give the same pointer
    found = problems_of("tiny_hanabi_selfplay", ["algorithm.balance_reward_classes=true"])
    assert any(p.startswith("algorithm.balance_reward_classes: moved to study.balance_reward_classes")
               for p in found)
    old = tmp_path / "old_keys.yaml"
    old.write_text("name: old\nalgorithm: {joint_search_every: 10, action_entropy_coef: 0.1}\n")
    with pytest.raises(ConfigError) as err:
        resolve_config(old)
    text = str(err.value)
    assert "algorithm.joint_search_every: moved to study.joint_search_every" in text
    assert "algorithm.action_entropy_coef: moved to study.action_entropy_coef" in text
    assert "unknown key" not in text
    res = _launch("--config_name", "tiny_hanabi_selfplay", "--cfg", "algorithm.joint_search_depth=1")
    assert res.returncode == 2 and "moved to study.joint_search_depth" in res.stderr


def test_built_in_models_resolve_and_a_typo_is_named():
    from roll_ma.models.loading import BUILTIN_MODELS, resolve_model_path

    for name in BUILTIN_MODELS:  # both ship in the package: no build, no download
        assert (Path(resolve_model_path(name)) / "model.safetensors").exists()
    assert load_config("tiny_hanabi_selfplay").model.path == "builtin:tiny-habits"
    found = problems_of("tiny_hanabi_selfplay", ["model.path=builtin:tiny-habit"])
    assert any("unknown built-in model 'builtin:tiny-habit' (did you mean 'builtin:tiny-habits'?)" in p
               for p in found)


def test_missing_backend_names_the_extra(monkeypatch):
    real = validate_module._installed
    monkeypatch.setattr(validate_module, "_installed", lambda m: False if m == "vllm" else real(m))
    found = problems_of("math_selfplay_tiny", ["rollout.backend=vllm"])
    assert any("vllm is not installed: pip install 'roll_ma[vllm]'" in p for p in found)


def test_agents_sharing_an_adapter_must_agree():
    found = problems_of("tiny_hanabi_selfplay", ["agents.1.adapter=player_0", "agents.1.lora.rank=4"])
    assert any("share adapter 'player_0' but set different LoRA settings" in p for p in found)
    cfg = load_config("tiny_hanabi_selfplay", overrides=["agents.1.adapter=player_0"])
    assert [a.adapter_name for a in cfg.agents] == ["player_0", "player_0"]


def test_mars_style_flags_map_onto_config_keys():
    cfg = load_config("tiny_hanabi_selfplay", overrides=["lora.rank=4", "lora.alpha=8"], num_agents=1)
    assert [a.name for a in cfg.agents] == ["agent_0"] and cfg.lora.rank == 4 and cfg.lora.alpha == 8.0
    found = problems_of("tiny_hanabi_selfplay", num_agents=3)
    assert any("has 2 players but 3 agents" in p for p in found)


def test_unknown_config_name_suggests():
    found = problems_of("tiny_hanabi_selfply")
    assert any("did you mean 'tiny_hanabi_selfplay'" in p for p in found)


def _launch(*args):
    return subprocess.run(
        [sys.executable, str(REPO / "start_pipeline.py"), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def test_launcher_bad_config_exits_nonzero_without_traceback():
    res = _launch("--config-name", "math_selfplay_tiny", "trainer.max_steps=oops", "trainer.nope=1")
    assert res.returncode == 2
    assert "trainer.max_steps" in res.stderr and "trainer.nope" in res.stderr
    assert "Traceback" not in res.stderr + res.stdout


def test_launcher_help_and_listing():
    res = _launch("--help")
    assert res.returncode == 0 and "--config_name" in res.stdout and "--num_agents" in res.stdout
    res = _launch("--list")
    assert res.returncode == 0 and "math_selfplay_tiny" in res.stdout


def test_joint_search_needs_a_small_cooperative_game_with_every_seat_trained():
    on = "study.joint_search_every=10"
    load_config("tiny_hanabi_selfplay", overrides=[on])  # fine
    found = problems_of("math_selfplay_tiny", [on])
    assert any(p.startswith("study.joint_search_every: math_selfplay is not an OpenSpiel") for p in found)
    found = problems_of("tiny_hanabi_selfplay", [on, "env.seats=[player_0,random]"])
    assert any("seats ['random'] are built-in or frozen" in p for p in found)
    found = problems_of("tiny_hanabi_selfplay", [on, "agents.1.frozen=true"])
    assert any("seats ['player_1'] are built-in or frozen" in p for p in found)
    found = problems_of("tiny_hanabi_selfplay", [on, "env.show_greedy_moves=true"])
    assert any("greedy moves" in p for p in found)
    found = problems_of("tiny_hanabi_selfplay", [on, "env.name=kuhn_poker"])
    assert any("needs a common-payoff game; kuhn_poker is zero-sum" in p for p in found)


@pytest.mark.parametrize("name", ["math_selfplay_7b", "hanabi_selfplay_7b"])
def test_cfg_validates_gpu_configs_on_a_machine_without_gpus(name):
    """--cfg checks everything but this machine's GPU count, and says how many GPUs the run needs."""
    for extra in ([], ["model.random_weights=true"]):
        out = subprocess.run([sys.executable, str(REPO / "start_pipeline.py"), "--config_name", name, "--cfg",
                              *extra], capture_output=True, text=True, cwd=REPO)
        assert out.returncode == 0, out.stderr
        assert '"name": "' + name + '"' in out.stdout
    bad = subprocess.run([sys.executable, str(REPO / "start_pipeline.py"), "--config_name", name, "--cfg",
                          "train.max_tokens_per_micro_batch=0"], capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 2 and "train.max_tokens_per_micro_batch" in bad.stderr


def test_random_weights_needs_a_known_architecture():
    found = problems_of("math_selfplay_7b", ["model.random_weights=true", "model.path=acme/unknown-7b"],
                        check_local_gpus=False)
    assert any(p.startswith("model.random_weights:") and "Qwen/Qwen2.5-7B" in p for p in found)


def test_configuration_reference_is_generated_from_the_schema_and_up_to_date(tmp_path):
    """docs/configuration.md lists every key with its type, default, allowed values and help; it is
    rewritten by `python -m roll_ma.config.reference`, and this fails when someone forgets to."""
    from roll_ma.config.reference import DOC, main, render_reference
    from roll_ma.config.schema import RunConfig
    from roll_ma.config.typed import describe

    text = render_reference()
    assert DOC.read_text() == text, "docs/configuration.md is stale: run python -m roll_ma.config.reference"
    for key, _tp, _default, _help in describe(RunConfig):  # a key, or a list of blocks with its own section
        assert f"| `{key}` |" in text or f"## `{key}` (a list" in text, key
    assert "| `agents[].lr` |" in text and "`ppo`, `sft`, `dpo`" in text and ">= 0" in text
    stale = tmp_path / "configuration.md"
    stale.write_text(text.replace("experiment name", "an old help text"))
    assert main(["--check", "--out", str(stale)]) == 1 and main(["--check"]) == 0


def test_an_unregistered_estimator_or_policy_loss_is_refused_at_load():
    """The names are plain strings in the config; the registries are asked before any actor starts."""
    problems = "\n".join(
        problems_of("math_selfplay_tiny", ["algorithm.advantage=grpoo", "algorithm.policy_loss=clip"])
    )
    assert "algorithm.advantage" in problems and "algorithm.policy_loss" in problems
    assert all(name in problems for name in ("registered:", "gae", "grpo", "reinforce_pp", "ppo_clip"))
