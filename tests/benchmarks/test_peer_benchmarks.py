"""benchmarks/peers (issue 32): the job file, the prompts each peer run gets, the rewards, each peer's
arguments against that peer's own config or parser, the result plumbing, and (slow) the driver on CPU
with roll_ma and TRL. verl and OpenRLHF cannot run on CPU; their argument checks run when the package
is importable (installed without its dependencies is enough) and skip otherwise."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

PEERS = Path(__file__).resolve().parents[2] / "benchmarks" / "peers"
sys.path[:0] = [str(PEERS), str(PEERS.parent)]

import import_check  # noqa: E402
import job as peer_job  # noqa: E402
import plot_steps  # noqa: E402
import rewards  # noqa: E402
import run_all  # noqa: E402
import run_openrlhf  # noqa: E402
import run_trl  # noqa: E402
import run_verl  # noqa: E402


@pytest.fixture(scope="module")
def job():
    return peer_job.load_job()


# ---------------------------------------------------------------------------- the job
def test_the_job_splits_every_step_evenly_over_the_agents(job):
    e = job.episodes
    assert (job.prompts_per_step(1), job.rows_per_step(1)) == (24, 192)  # 8 games x 3 turns, 8 samples each
    assert (job.prompts_per_step(3), job.rows_per_step(3)) == (8, 64)
    for n in job.agents:  # the peers' N runs together train exactly roll_ma's rows of a step
        assert n * job.rows_per_step(n) == e.groups_per_step * e.group_size * e.turns


def _write(tmp_path: Path, job, **changes) -> Path:
    raw = json.loads(json.dumps(dataclasses.asdict(job)))  # tuples -> lists, as YAML has them
    raw.pop("source")
    for dotted, value in changes.items():
        section, _, key = dotted.rpartition("__")
        (raw[section] if section else raw)[key] = value
    path = tmp_path / "job.yaml"
    path.write_text(json.dumps(raw))  # JSON is YAML
    return path


def test_job_errors_name_the_file_and_the_key(tmp_path, job):
    path = _write(tmp_path, job, episodes__turnz=3)
    with pytest.raises(ValueError, match=rf"{path}: unknown key\(s\) episodes.turnz") as err:
        peer_job.load_job(path)
    assert "job.yaml documents every key" in str(err.value)
    with pytest.raises(ValueError, match=r"lora.rank must be int, got '16'"):
        peer_job.load_job(_write(tmp_path, job, lora__rank="16"))
    with pytest.raises(ValueError, match=r"episodes.turns=2 is not a multiple of agents \[3\]"):
        peer_job.load_job(_write(tmp_path, job, episodes__turns=2))
    w = job.warmup_steps
    with pytest.raises(ValueError, match=rf"steps={w} must exceed warmup_steps={w} >= 1"):
        peer_job.load_job(_write(tmp_path, job, steps=w))


def test_game_seeds_are_those_roll_mas_planner_plays(job):
    from roll_ma.config.schema import EnvConfig
    from roll_ma.pipelines.episodes import EpisodePlanner

    env = EnvConfig(name="seat_game:SeatGame", groups_per_step=3, group_size=2)
    planner = EpisodePlanner(env, seed=7)
    for step in (1, 2):
        specs = planner.train_assignments(step, 1)[0]
        assert [s.seed for s in specs] == [peer_job.game_seed(7, step, g) for g in range(3) for _ in range(2)]


def test_each_agent_gets_its_seats_turns_and_together_every_turn(job):
    small = dataclasses.replace(job, steps=2, episodes=dataclasses.replace(job.episodes, groups_per_step=2))
    per_agent = [peer_job.agent_prompts(small, 3, a) for a in range(3)]
    for a, steps in enumerate(per_agent):
        assert len(steps) == 2 and all(len(p) == small.prompts_per_step(3) for p in steps)
        assert all(m[0]["content"] == f"You are seat {a} of 3. Say digits." for p in steps for m in p)
    env = peer_job.seat_game(small, 3)
    turns = []
    for g in range(2):
        turn = env.reset(peer_job.game_seed(small.seed, 1, g))
        while turn is not None:
            turns.append(turn.messages[1]["content"])
            turn = env.step("0").next_turn
    assert sorted(m[1]["content"] for steps in per_agent for m in steps[0]) == sorted(turns)


def test_rewards_score_the_reply_the_same_in_every_framework_shape():
    assert rewards.digit_share("a1b2") == 0.5 and rewards.digit_share("") == 0.0
    assert rewards.trl_reward(["12", [{"role": "assistant", "content": "1x"}]]) == [1.0, 0.5]
    assert rewards.verl_compute_score("seat_game", "9a", "") == 0.5
    out = rewards.reward_func(["PROMPT 12ab", "other"], ["PROMPT ", "x"], ["", ""])
    assert out["rewards"].tolist() == [0.5, 0.0] and out["scores"] is out["rewards"]


# ---------------------------------------------------------------------------- the peers' arguments
def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)  # a top-level package: located, not imported
    return Path(spec.origin).parent if spec and spec.origin else None


def test_verl_overrides_compose_with_verls_own_config(job):
    root = _package_dir("verl")
    if root is None:
        pytest.skip("verl is not installed (pip install --no-deps verl==0.9.1 is enough for this check)")
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    overrides = run_verl.verl_overrides(job, 3, "/m", "/t.parquet", "/o", flash_attn=False)
    with initialize_config_dir(config_dir=str(root / "trainer" / "config"), version_base=None):
        cfg = OmegaConf.to_container(compose(config_name="ppo_trainer", overrides=overrides), resolve=True)
    arr = cfg["actor_rollout_ref"]
    assert arr["model"]["lora_rank"] == 16 and arr["model"]["target_modules"] == list(job.lora.target_modules)
    assert arr["model"]["override_config"] == {"attn_implementation": "sdpa"}
    assert arr["model"]["use_remove_padding"] is False
    assert cfg["data"]["train_batch_size"] == arr["actor"]["ppo_mini_batch_size"] == 8  # one optimizer step
    assert arr["rollout"]["n"] == 8 and arr["rollout"]["load_format"] == "safetensors"
    assert arr["rollout"]["response_length"] == job.generation.max_new_tokens
    assert (arr["actor"]["kl_loss_type"], arr["actor"]["loss_agg_mode"]) == ("low_var_kl", "token-mean")
    assert cfg["trainer"]["n_gpus_per_node"] == 1 and cfg["trainer"]["total_training_steps"] == job.steps
    assert cfg["reward"]["custom_reward_function"]["name"] == "verl_compute_score"
    # FSDP2 for the actor and the reference (ppo_lora.rst), weights loaded in the job's bf16
    assert arr["actor"]["strategy"] == arr["ref"]["strategy"] == "fsdp2"
    dtypes = [arr[role]["fsdp_config"]["model_dtype"] for role in ("actor", "ref")]
    assert dtypes == ["bfloat16", "bfloat16"]
    assert arr["rollout"]["dtype"] == "bfloat16"
    # the shared run: one adapter, every seat's prompts of a step in one batch (= one optimizer step)
    shared = run_verl.verl_overrides(job, 3, "/m", "/t.parquet", "/o", flash_attn=False, agent=None)
    assert "data.train_batch_size=24" in shared and "actor_rollout_ref.actor.ppo_mini_batch_size=24" in shared


def _config_has(cfg: dict, dotted: str) -> bool:
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_every_verl_override_key_is_in_verls_config(job):
    """Each override names a key of verl's own flattened config (its _generated_ppo_trainer.yaml); a key
    added with "+" (not in verl's schema) must hang under a key that is."""
    root = _package_dir("verl")
    if root is None:
        pytest.skip("verl is not installed (pip install --no-deps verl==0.9.1 is enough for this check)")
    import yaml

    cfg = yaml.safe_load((root / "trainer" / "config" / "_generated_ppo_trainer.yaml").read_text())
    for flash_attn, legacy, agent in [(False, True, 0), (True, False, None)]:
        overrides = run_verl.verl_overrides(job, 3, "/m", "/t.parquet", "/o", legacy, flash_attn, agent)
        keys = [o.split("=", 1)[0] for o in overrides]
        assert [k for k in keys if not k.startswith("+") and not _config_has(cfg, k)] == []
        added = [k[1:].rpartition(".")[0] for k in keys if k.startswith("+")]
        assert [k for k in added if not _config_has(cfg, k)] == []
    assert not _config_has(cfg, "actor_rollout_ref.actor.fsdp_config.model_dtypo")


def test_import_check_lists_the_modules_a_verl_run_imports_and_names_what_is_missing(tmp_path):
    modules = import_check.import_check_modules(PEERS / "requirements-verl.txt")
    # the vLLM OpenAI server verl starts (and the /metrics route build_app adds) are on the list
    server = ["vllm.entrypoints.openai.api_server", "vllm.entrypoints.serve.instrumentator.metrics"]
    for name in ["verl.trainer.main_ppo", "verl.workers.rollout.vllm_rollout.vllm_async_server", *server]:
        assert name in modules
    # a chain: chain_a needs the missing pkg_one, and once that is stubbed, the missing pkg_two.sub
    (tmp_path / "chain_a.py").write_text("import pkg_one\nfrom pkg_one import thing\nimport pkg_two.sub\n")
    mods = ["json", "chain_a", "no_such_module_xyz"]
    results, _ = import_check.import_modules(sys.executable, mods, str(tmp_path), tmp_path)
    assert [(r["module"], r["missing"]) for r in results] == [
        ("json", []),
        ("chain_a", ["pkg_one", "pkg_two"]),  # pkg_two's stub is a package: pkg_two.sub is stubbed too
        ("no_such_module_xyz", ["no_such_module_xyz"]),
    ]


def test_verl_step_line_matches_once_per_step_through_rays_prefix():
    lines = [
        "(TaskRunnerV1 pid=41) step:1 - actor/entropy:0.5 - timing_s/gen:3.0 - timing_s/step:9.5",
        "step:2 - timing_s/gen:2.0 - timing_s/step:6.25 - response_length/mean:200.0",
        "(TaskRunnerV1 pid=41) step:0 - val-core/seat_game/reward/mean@1:0.5",  # a validation line
        "(TaskRunnerV1 pid=41) global_step:3 - timing_s/step:1.0",
        "Training Progress:  29%|██▊       | 2/7 [00:20<00:50, 10.0s/it]",
    ]
    assert [bool(run_verl.STEP_LINE.search(line)) for line in lines] == [True, True, False, False, False]


def test_verl_phases_come_from_its_file_logger(job, tmp_path):
    rows = [
        {"timing_s/step": 10.0 + i, "timing_s/gen": 4.0, "timing_s/old_log_prob": 1.0,
         "timing_s/ref": 0.5 + i, "timing_s/update_actor": 3.0, "timing_s/update_weights": 0.25,
         "response_length/mean": 100.0 + i, "perf/max_memory_allocated_gb": 30.0 + i}
        for i in range(4)
    ]  # fmt: skip
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": i + 1, "data": r}) + "\n" for i, r in enumerate(rows)))
    out = run_verl.read_metrics(path, warmup=2)
    phases = out["phases_s"]  # medians of steps 3 and 4
    assert (phases["rollout"], phases["update"], phases["sync"]) == (4.0, 3.0, 0.25)
    assert (phases["old_log_prob"], phases["ref"], phases["scoring"]) == (1.0, 3.0, 4.0)
    assert out["response_length_mean"] == 103.0 and out["framework_peak_gb"] == 33.0
    passes = run_verl.verl_passes(job)
    assert "old log-probs: none" in passes and "adapter off" in passes
    assert "old log-probs: a separate forward" in run_verl.verl_passes(job, recompute_old_log_probs=True)
    # the table's rows: no old-log-prob forward in any framework; verl's default only as a labelled variant
    overrides = run_verl.verl_overrides(job, 3, "M", "T", "O")
    assert "algorithm.rollout_correction.bypass_mode=True" in overrides
    assert not any(
        "bypass_mode" in o
        for o in run_verl.verl_overrides(job, 3, "M", "T", "O", recompute_old_log_probs=True)
    )


def _parser_options(path: Path) -> dict[str, list | None]:
    """{--flag: its literal choices or None} of every add_argument call in ``path``; a flag built by an
    f-string (OpenRLHF's per-model optimizer flags, f"--{prefix}.adam.lr") is kept as a regex."""
    options: dict[str, list | None] = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
            continue
        choices = next((k.value for k in node.keywords if k.arg == "choices"), None)
        for a in node.args:
            if isinstance(a, ast.Constant) and str(a.value).startswith("--"):
                name = re.escape(a.value)
            elif isinstance(a, ast.JoinedStr):
                name = "".join(
                    re.escape(v.value) if isinstance(v, ast.Constant) else r"\w+" for v in a.values
                )
            else:
                continue
            options[name] = ast.literal_eval(choices) if isinstance(choices, ast.List) else None
    return options


def _option(options: dict[str, list | None], flag: str) -> str | None:
    return next((pattern for pattern in options if re.fullmatch(pattern, flag)), None)


def test_openrlhf_arguments_are_flags_of_its_train_ppo_ray(job):
    root = _package_dir("openrlhf")
    if root is None:
        pytest.skip(
            "openrlhf is not installed (pip install --no-deps openrlhf==0.11.2 is enough for this check)"
        )
    options = _parser_options(root / "cli" / "train_ppo_ray.py")
    argv = run_openrlhf.openrlhf_args(job, 3, "/m", "/p.jsonl", "/o", flash_attn=False)
    flags = [a for a in argv if a.startswith("--")]
    assert [f for f in flags if _option(options, f) is None] == []
    assert _option(options, "--actor.adam.lr") and not _option(options, "--actor.adam.lrr")
    for flag, value in [("--algo.advantage.estimator", "group_norm"), ("--actor.loss_agg_mode", "token-mean"),
                        ("--algo.kl.estimator", "k3")]:  # fmt: skip
        assert argv[argv.index(flag) + 1] == value and value in options[_option(options, flag)]
    assert (
        argv[argv.index("--rollout.batch_size") + 1] == "8"
        and argv[argv.index("--train.batch_size") + 1] == "64"
    )


def test_verl_reads_the_agents_parquet_and_the_reward(job, tiny_model_dir, tmp_path):
    rl_dataset = pytest.importorskip("verl.utils.dataset.rl_dataset", reason="verl with its dependencies")
    from hydra import compose, initialize_config_dir
    from transformers import AutoTokenizer
    from verl.utils.import_utils import load_extern_object

    path = run_verl.write_train_file(job, 3, 1, tmp_path / "train.parquet")
    overrides = run_verl.verl_overrides(job, 3, tiny_model_dir, str(path), str(tmp_path), flash_attn=False)
    config_dir = _package_dir("verl") / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    data = rl_dataset.RLHFDataset(data_files=[str(path)], tokenizer=tokenizer, config=cfg.data)
    assert len(data) == job.steps * job.prompts_per_step(3)  # none filtered as too long
    assert data[0]["raw_prompt"][0]["content"] == "You are seat 1 of 3. Say digits."
    reward = cfg.reward.custom_reward_function
    assert load_extern_object(module_path=reward.path, object_name=reward.name)("seat_game", "1a", "") == 0.5


def test_openrlhf_reads_the_agents_prompts(job, tiny_model_dir, tmp_path):
    prompts_dataset = pytest.importorskip(
        "openrlhf.datasets.prompts_dataset", reason="openrlhf + dependencies"
    )
    from types import SimpleNamespace

    from datasets import load_dataset
    from transformers import AutoTokenizer

    path = run_openrlhf.write_prompts(job, 3, 2, tmp_path / "prompts.jsonl")
    data_args = SimpleNamespace(
        input_key="prompt", label_key=None, apply_chat_template=True
    )  # as the runner's
    strategy = SimpleNamespace(args=SimpleNamespace(data=data_args), is_rank_0=lambda: True)
    rows = load_dataset("json", data_files=str(path))["train"]
    data = prompts_dataset.PromptDataset(rows, AutoTokenizer.from_pretrained(tiny_model_dir), strategy)
    _, prompt, label, _ = data[0]
    assert len(data) == job.steps * job.prompts_per_step(3)
    assert prompt.startswith("<|im_start|>system\nYou are seat 2 of 3.") and label == ""
    assert rewards.reward_func([prompt + "12ab"], [prompt], [label])["rewards"].tolist() == [0.5]


def test_trl_micro_batches_are_the_largest_divisor_of_the_step_in_the_token_budget(job):
    # a padded row = the longest prompt (~136 tokens with the chat template) + max_new_tokens (256)
    row = 136 + job.generation.max_new_tokens
    assert job.train.micro_batch_tokens == 16384 and row == 392
    assert run_trl.micro_batch_rows(job.rows_per_step(1), row, job.train.micro_batch_tokens) == 32  # of 192
    assert run_trl.micro_batch_rows(job.rows_per_step(3), row, job.train.micro_batch_tokens) == 32  # of 64
    assert run_trl.micro_batch_rows(192, 512 + 256, 16384) == 16  # 24 x 768 > 16384: 16, not 21
    assert run_trl.micro_batch_rows(6, 20000, 16384) == 1  # no row fits: one row a micro-batch


def test_trl_passes_follow_its_config(job, tmp_path, monkeypatch):
    pytest.importorskip("trl")
    # GRPOConfig starts accelerate's state, which reads RANK / WORLD_SIZE: earlier tests in the session
    # (tests/distributed/test_distributed.py) leave them behind, as run_all's runner_env knows
    for name in run_all.DISTRIBUTED_VARS:
        monkeypatch.delenv(name, raising=False)
    args = dict(job=job, rows=192, micro=32, device="cpu", use_vllm=True, out_dir=str(tmp_path))
    ours = run_trl.trl_passes(run_trl.grpo_config(is_correction=False, **args))
    assert "no old log-probs" in ours and "correction off" in ours and "reference log-probs" in ours
    assert "6 training micro-batches" in ours
    trls = run_trl.trl_passes(run_trl.grpo_config(is_correction=True, **args))
    assert "old log-probs (for the vLLM importance-sampling correction)" in trls and "correction on" in trls


def test_each_peer_imports_its_own_site_packages_first(tmp_path):
    # the folders are named site-packages: dill (datasets' fingerprint) pickles other modules by value
    for name in ("trl", "common"):
        (tmp_path / name / "site-packages").mkdir(parents=True)
    paths = run_all.runner_env("trl", tmp_path)["PYTHONPATH"].split(os.pathsep)
    own, shared = (str(tmp_path / name / "site-packages") for name in ("trl", "common"))
    assert paths[:3] == [own, shared, str(run_all.REPO)]
    assert str(run_all.REPO) == run_all.runner_env("verl", tmp_path)["PYTHONPATH"].split(os.pathsep)[0]


def test_openrlhf_step_lines_are_read_through_rays_prefix():
    out = "\n".join(
        [
            "(PPOTrainer pid=12) INFO ✨ Global step 2: {'policy_loss': -0.01, 'response_length': 256.0, "
            "'timing/step_total': np.float64(41.5)}",
            "(PPOTrainer pid=12) ✨ Global step 1: {'response_length': 250.0, 'timing/step_total': 80.25}",
            "unrelated line",
        ]
    )
    steps = run_openrlhf.parse_steps(out)
    assert [s["timing/step_total"] for s in steps] == [80.25, 41.5] and steps[1]["response_length"] == 256.0


def test_flash_attn_stand_in_imports_and_refuses_to_compute(tmp_path):
    root = run_openrlhf.write_flash_attn_shim(tmp_path)
    code = (
        "from flash_attn.bert_padding import index_first_axis, pad_input, rearrange, unpad_input\n"
        "from flash_attn.utils.distributed import all_gather\n"
        "try:\n    unpad_input(None, None)\nexcept NotImplementedError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert "import-only stand-in for flash-attn" in out.stdout


# ---------------------------------------------------------------------------- results
def test_step_times_are_the_wall_time_between_step_ends():
    # ends at 10, 19, 21, 24, 27, 31, 33 s: steps 2..7 took 9, 2, 3, 3, 4, 2 s; two warm-up steps
    summary = peer_job.step_summary_from_ends([10.0, 19.0, 21.0, 24.0, 27.0, 31.0, 33.0], warmup=2)
    assert summary["step_times_s"] == [None, 9.0, 2.0, 3.0, 3.0, 4.0, 2.0]
    assert (summary["step_s"], summary["step_min_s"], summary["step_max_s"], summary["timed_steps"]) == (
        3.0, 2.0, 4.0, 5,
    )  # fmt: skip
    # step 1 has no previous end: even without warm-up it is never timed
    assert peer_job.step_summary_from_ends([5.0, 7.0], warmup=0)["timed_steps"] == 1
    # the start-up and step 1 together, from when the runner began (same clock), when it is given
    started_late = peer_job.step_summary_from_ends([105.0, 107.0], warmup=0, started_at=20.0)
    assert started_late["first_step_end_s"] == 85.0
    assert summary["first_step_end_s"] is None
    steps = [{"t/gen": 9.0}, {"t/gen": 1.0}, {"t/gen": 3.0}, {"t/gen": 2.0}, {}]
    assert peer_job.phase_medians(steps, {"rollout": "t/gen", "sync": "t/sync"}, warmup=1) == {
        "rollout": 2.0, "sync": None,
    }  # fmt: skip


def test_result_lines_and_the_combined_row():
    lines = "noise\nJSON " + json.dumps({"step_s": 2.0}) + "\nJSON " + json.dumps({"step_s": 3.0}) + "\ntail"
    assert peer_job.read_result(lines) == {"step_s": 3.0} and peer_job.read_result("none") is None
    assert peer_job.is_oom("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate")
    h100 = "NVIDIA H100 80GB HBM3"
    runs = [
        {"framework": "trl", "agents": 2, "agent": 0, "step_s": 2.0, "step_min_s": 1.5, "step_max_s": 2.5,
         "response_tokens_per_step": 100.0, "gpu_peak_gb": 50.0, "gpu_name": h100,
         "phases_s": {"rollout": 1.0}, "first_step_end_s": 90.0},
        {"framework": "trl", "agents": 2, "agent": 1, "step_s": 3.0, "step_min_s": 2.0, "step_max_s": 4.0,
         "response_tokens_per_step": 150.0, "gpu_peak_gb": 60.0, "oom": False, "gpu_name": h100,
         "phases_s": {"rollout": 2.0}, "first_step_end_s": 80.0},
        {"framework": "roll_ma", "agents": 2, "step_s": 2.5, "response_tokens_per_step": 250.0,
         "gpu_name": h100},
        {"framework": "verl", "agents": 2, "agent": 0, "step_s": None, "error": "ValueError: x", "oom": True},
        {"framework": "openrlhf", "agents": 2, "agent": 0, "step_s": 4.0, "response_tokens_per_step": 100.0,
         "gpu_name": h100},
        {"framework": "roll_ma", "agents": 2, "shared": True, "step_s": 2.0, "gpu_name": h100},
        {"framework": "trl", "agents": 2, "agent": None, "shared": True, "step_s": 3.0,
         "gpu_name": "NVIDIA H200"},
    ]  # fmt: skip
    ours, trl, verl, openrlhf, ours_shared, trl_shared = run_all.table_rows(runs)
    assert (trl["step_s"], trl["step_min_s"], trl["step_max_s"], trl["tokens_per_s"]) == (5.0, 3.5, 6.5, 50.0)
    assert (trl["gpu_peak_gb"], trl["vs_roll_ma"], trl["phases_s"], trl["gpu"]) == (
        60.0,
        2.0,
        {"rollout": 3.0},
        h100,
    )
    assert (trl["runs"], trl["status"], ours["runs"], ours["vs_roll_ma"]) == ("2/2", "ok", "1/1", 1.0)
    assert trl["first_step_end_s"] == 90.0 and ours["first_step_end_s"] is None  # the slowest run's start
    assert (verl["step_s"], verl["vs_roll_ma"], verl["oom"], verl["status"]) == (
        None,
        None,
        True,
        "ValueError: x",
    )
    # one of the two runs measured: no step time, never an estimate
    assert (openrlhf["step_s"], openrlhf["vs_roll_ma"], openrlhf["status"]) == (
        None,
        None,
        "incomplete: 1 of 2 runs",
    )
    # shared-adapter rows are one run each, compared with roll_ma's shared row, and only on the same GPU model
    assert (ours_shared["adapters"], ours_shared["runs"], trl_shared["runs"]) == ("1 shared", "1/1", "1/1")
    assert trl_shared["step_s"] == 3.0 and trl_shared["vs_roll_ma"] is None
    # a later call's run replaces the same (framework, N, agent, shared), keeps the others
    merged = run_all.merge_runs(runs, [{"framework": "verl", "agents": 2, "agent": 0, "step_s": 6.0}])
    assert len(merged) == len(runs) and merged[-1]["step_s"] == 6.0


def test_the_plan_runs_every_agent_of_every_peer_and_the_shared_rows():
    frameworks = run_all.parse_frameworks("roll_ma,trl,openrlhf@1")
    plan = run_all.plan_runs(frameworks, [1, 3], shared=True)
    assert sorted(map(str, (r for r in plan if r[0] == "trl"))) == sorted(map(str, [
        ("trl", 1, 0, False), ("trl", 3, 0, False), ("trl", 3, 1, False), ("trl", 3, 2, False),
        ("trl", 3, None, True),
    ]))  # fmt: skip
    assert [r for r in plan if r[0] == "openrlhf"] == [("openrlhf", 1, 0, False)]
    assert plan[0][0] == "roll_ma" and ("roll_ma", 3, None, True) in plan
    with pytest.raises(ValueError, match="known are"):
        run_all.parse_frameworks("roll_ma,deepspeed-chat")
    # each planned run reaches its runner as that run: shared rows on one adapter, a peer's run on its agent
    args = argparse.Namespace(job=None, device="cuda", smoke=False)
    tail = lambda *run: run_all.runner_command(*run, "M", args)[2:]  # noqa: E731
    assert "--shared" in tail("roll_ma", 3, None, True) and "--shared" not in tail("roll_ma", 3, None, False)
    assert "--shared" in tail("trl", 3, None, True) and "--agent" not in tail("trl", 3, None, True)
    assert tail("verl", 3, 1, False)[-2:] == ["--agent", "1"]
    assert "--is-correction" in tail("trl_is", 1, 0, False)
    # roll_ma's turn-by-turn variant is one run of all agents, like roll_ma's own rows
    assert "--turnwise" in tail("roll_ma_turnwise", 3, None, False)
    assert "--agent" not in tail("roll_ma_turnwise", 3, None, False)
    turnwise = run_all.plan_runs(run_all.parse_frameworks("roll_ma_turnwise@1"), [1, 3], shared=False)
    assert turnwise == [("roll_ma_turnwise", 1, None, False)]
    # the table's own rows first, then roll_ma's variants and OpenRLHF, the peers' variants last
    wanted = run_all.parse_frameworks("trl_is@1,roll_ma_liger@1,openrlhf@1,verl@1")
    order = run_all.plan_runs(wanted, [1], shared=False)
    assert [r[0] for r in order] == ["verl", "roll_ma_liger", "openrlhf", "trl_is"]


def test_runs_start_apart_so_their_ray_instances_do_not_start_together():
    now = [0.0]
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    stagger = run_all.StartStagger(45.0, clock=lambda: now[0], sleep=sleep)
    stagger.wait_turn()  # the first run starts at once
    now[0] += 10.0
    stagger.wait_turn()  # 10 s later: waits the other 35
    now[0] += 100.0
    stagger.wait_turn()  # long after: no wait
    assert slept == [35.0]


@pytest.mark.slow
def test_driver_runs_roll_ma_and_trl_on_cpu(tmp_path):
    frameworks = ["roll_ma"] + (["trl"] if importlib.util.find_spec("trl") else [])
    summary = run_all.main(
        ["--device", "cpu", "--smoke", "--frameworks", ",".join(frameworks), "--agents", "3",
         "--out-dir", str(tmp_path)]
    )  # fmt: skip
    rows = {r["framework"]: r for r in summary["rows"]}
    assert sorted(rows) == sorted(frameworks)
    for name, row in rows.items():
        assert row["status"] == "ok" and row["step_s"] > 0 and row["tokens_per_s"] > 0, (name, row)
    assert rows["roll_ma"]["runs"] == "1/1" and rows.get("trl", {"runs": "3/3"})["runs"] == "3/3"
    assert (tmp_path / "peers.md").read_text().startswith("| framework | agents |")
    runs = [r for r in summary["runs"] if r["framework"] == "trl"]
    assert all(r["rows_per_step"] == 2 and r["rollout"] == "transformers generate" for r in runs)
    assert all(r["micro_batch_rows"] == 2 and "no old log-probs" in r["passes"] for r in runs)
    # roll_ma's run carries its own start-up stages beside the common clock's first_step_end_s
    (roll_ma_run,) = [r for r in summary["runs"] if r["framework"] == "roll_ma"]
    assert {"train_model", "rollout_engine", "first_sync", "total"} <= set(roll_ma_run["startup_s"])


def test_the_step_plot_splits_each_step_by_its_own_timers_and_names_the_rest(tmp_path):
    rows = [
        {"framework": "roll_ma", "agents": 1, "shared": False, "step_s": 10.0,
         "phases_s": {"rollout": 3.0, "scoring": 2.0, "update": 4.0, "sync": 0.5}},
        {"framework": "verl", "agents": 3, "shared": True, "step_s": 20.0,
         "phases_s": {"rollout": 4.0, "ref": 6.0, "old_log_prob": 0.1, "update": 8.0, "sync": 1.0}},
        {"framework": "trl", "agents": 1, "shared": False, "step_s": 12.0, "phases_s": None},
    ]  # fmt: skip
    ours, verl, trl = plot_steps.pick_rows({"rows": rows}, ["roll_ma@1", "verl@3s", "trl@1"])
    assert plot_steps.bar_parts(ours)["reference"] == 2.0 and plot_steps.bar_parts(ours)["other"] == 0.5
    verl_parts = plot_steps.bar_parts(verl)
    assert verl_parts["reference"] == 6.0 and verl_parts["old log-probs"] == 0.1
    assert plot_steps.bar_parts(trl) == {**dict.fromkeys(plot_steps.PHASES, 0.0), "no phase timers": 12.0}
    with pytest.raises(SystemExit, match="no measured row 'verl@1'"):
        plot_steps.pick_rows({"rows": rows}, ["verl@1"])
