"""benchmarks/peers (issue 32): the job file and its rows (each a framework at named settings), the prompts
each peer run gets, the rewards, each runner's arguments built from its row alone (against that peer's
own config or parser where it is installed), the result plumbing (repeats, the median of medians, the
headline), the relay job, and (slow) the driver on CPU with roll_ma and TRL. verl and OpenRLHF cannot run
on CPU; their arguments are checked against their own config when the package is importable (installed
without its dependencies is enough) and skipped otherwise."""

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

from roll_ma.config.run_plan import run_plan
from roll_ma.training.micro_batches import MicroBatching

PEERS = Path(__file__).resolve().parents[2] / "benchmarks" / "peers"
sys.path[:0] = [str(PEERS), str(PEERS.parent)]

import import_check  # noqa: E402
import job as peer_job  # noqa: E402
import merge_tables  # noqa: E402
import plot_steps  # noqa: E402
import rewards  # noqa: E402
import run_all  # noqa: E402
import run_openrlhf  # noqa: E402
import run_roll_ma  # noqa: E402
import run_trl  # noqa: E402
import run_verl  # noqa: E402

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
REMOVE = object()  # _write: the key taken out


@pytest.fixture(scope="module")
def job():
    return peer_job.load_job()


@pytest.fixture
def no_rendezvous(monkeypatch):
    """GRPOConfig starts accelerate's state, which reads RANK / WORLD_SIZE: earlier tests in the session
    (tests/distributed/test_distributed.py) leave them behind, as run_all's runner_env knows."""
    for name in run_all.DISTRIBUTED_VARS:
        monkeypatch.delenv(name, raising=False)


def _with_settings(row, **changes):
    return dataclasses.replace(row, settings=dataclasses.replace(row.settings, **changes))


# ---------------------------------------------------------------------------- the job
def test_the_job_splits_every_step_evenly_over_the_agents(job):
    e = job.episodes
    assert (job.groups_per_step(1), job.prompts_per_step(1), job.rows_per_step(1)) == (8, 24, 192)
    assert (job.groups_per_step(3), job.prompts_per_step(3), job.rows_per_step(3)) == (8, 8, 64)
    for n in job.agents:  # the peers' N runs together train exactly roll_ma's rows of a step
        assert n * job.rows_per_step(n) == e.rows_per_step == 192
        assert job.groups_per_step(n) * e.group_size * job.turns(n) == e.rows_per_step


def test_eight_agents_play_three_games_of_eight_turns_and_each_gets_an_even_share(job):
    assert (job.turns(8), job.groups_per_step(8)) == (8, 3)
    assert job.groups_per_step(8) * job.episodes.group_size * job.turns(8) == job.episodes.rows_per_step
    assert (job.prompts_per_step(8), job.rows_per_step(8)) == (3, 24)  # 3 games x 8 turns / 8 agents
    one_step = dataclasses.replace(job, steps=1)
    shares = [peer_job.agent_prompts(one_step, 8, a)[0] for a in range(8)]
    assert [len(p) for p in shares] == [3] * 8  # each seat acts once in each of the 3 games
    assert all(
        m[0]["content"] == f"You are seat {a} of 8. Say digits." for a, p in enumerate(shares) for m in p
    )
    (every_seat,) = peer_job.agent_prompts(one_step, 8, None)
    assert sorted(m[1]["content"] for p in shares for m in p) == sorted(m[1]["content"] for m in every_seat)
    assert len(every_seat) == 24 and peer_job.rows_of_run(job, 8, None) == 192


def _write(tmp_path: Path, **changes) -> Path:
    """job.yaml with ``changes`` (``a__b``: the key a.b; REMOVE: the key taken out), as a file."""
    import yaml

    raw = yaml.safe_load(peer_job.DEFAULT_JOB.read_text())
    for dotted, value in changes.items():
        *parents, leaf = dotted.split("__")
        node = raw
        for key in parents:
            node = node[key]
        if value is REMOVE:
            node.pop(leaf)
        else:
            node[leaf] = value
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_job_errors_name_the_file_and_the_key(tmp_path):
    path = _write(tmp_path, episodes__turnz=3)
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: unknown key\(s\) episodes.turnz") as err:
        peer_job.load_job(path)
    assert "job.yaml documents every key" in str(err.value)
    with pytest.raises(ValueError, match=r"lora.rank must be int, got '16'"):
        peer_job.load_job(_write(tmp_path, lora__rank="16"))
    with pytest.raises(ValueError, match=r"episodes.turns at N = \[3\] is not a multiple of N"):
        peer_job.load_job(_write(tmp_path, episodes__turns={1: 3, 3: 2, 8: 8}))
    with pytest.raises(ValueError, match=r"episodes.turns gives no turns for agents \[8\]"):
        peer_job.load_job(_write(tmp_path, episodes__turns={1: 3, 3: 3}))
    # 96 rows: 4 games of 8 x 3 at N = 1 and 3, but 1.5 games of 8 x 8 at N = 8
    with pytest.raises(ValueError, match=r"rows_per_step=96 is not a whole number of games .* at N = \[8\]"):
        peer_job.load_job(_write(tmp_path, episodes__rows_per_step=96))
    w = peer_job.load_job().warmup_steps
    with pytest.raises(ValueError, match=rf"steps={w} must exceed warmup_steps={w} >= 1"):
        peer_job.load_job(_write(tmp_path, steps=w))
    with pytest.raises(ValueError, match=r"repeats must be >= 1"):
        peer_job.load_job(_write(tmp_path, repeats=0))


def test_a_job_file_missing_or_not_yaml_is_one_line_naming_the_file(tmp_path):
    with pytest.raises(ValueError, match=r"job file .*jobs.yaml: no such file .*beside run_all.py: job.yaml"):
        peer_job.load_job(tmp_path / "jobs.yaml")
    (tmp_path / "notes.md").write_text("# notes\n\n`code` here: and: there\n")
    with pytest.raises(ValueError, match=r"job file .*notes.md: not YAML at line 3, column 1"):
        peer_job.load_job(tmp_path / "notes.md")


def test_a_row_limited_to_an_n_this_call_does_not_run_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        run_all.main(["--device", "cpu", "--rows", "roll_ma@2", "--agents", "1", "--out-dir", str(tmp_path)])
    refused = "--rows roll_ma@2: N is not among the agents this call runs (1; --agents)"
    assert refused in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing built, nothing written


def test_row_errors_name_the_row_and_its_key(tmp_path):
    with pytest.raises(ValueError, match=r"unknown key\(s\) rows.openrlhf.settings.ligr"):
        peer_job.load_job(_write(tmp_path, rows__openrlhf__settings__ligr=True))
    with pytest.raises(
        ValueError, match=r"unknown key\(s\) rows.openrlhf.nativ; missing key\(s\) rows.openrlhf"
    ):
        peer_job.load_job(_write(tmp_path, rows__openrlhf__nativ={}, rows__openrlhf__native=REMOVE))
    with pytest.raises(ValueError, match=r"missing key\(s\) rows.openrlhf.settings.liger_kernel"):
        peer_job.load_job(_write(tmp_path, rows__openrlhf__settings__liger_kernel=REMOVE))
    with pytest.raises(
        ValueError,
        match=r"rows.openrlhf.framework='deepspeed-chat': use one of roll_ma, trl, verl, openrlhf, atgrpo",
    ):
        peer_job.load_job(_write(tmp_path, rows__openrlhf__framework="deepspeed-chat"))
    with pytest.raises(ValueError, match=r"rows.openrlhf.settings.attention='flash': use packed or padded"):
        peer_job.load_job(_write(tmp_path, rows__openrlhf__settings__attention="flash"))
    with pytest.raises(ValueError, match=r"rows.openrlhf.settings.update_tokens must be int"):
        peer_job.load_job(_write(tmp_path, rows__openrlhf__settings__update_tokens="16k"))
    with pytest.raises(ValueError, match=r"settings.sleep_rollout must be true, false or kv_cache"):
        peer_job.load_job(_write(tmp_path, rows__openrlhf__settings__sleep_rollout="kv"))


def test_a_runner_takes_its_rows_settings_and_refuses_another_frameworks_row(job, capsys, monkeypatch):
    monkeypatch.delenv(
        "VLLM_USE_FLASHINFER_SAMPLER", raising=False
    )  # parse_runner_args sets it: undone after
    p = peer_job.runner_parser(None)
    base = ["--agents", "3", "--agent", "0", "--model", "M"]
    _, _, row = peer_job.parse_runner_args(p, base, "trl")
    assert row == job.rows["trl"]  # the default row: the framework's name
    _, _, best = peer_job.parse_runner_args(p, [*base, "--row", "trl_best"], "trl")
    assert (best.name, best.settings) == ("trl_best", job.rows["trl_best"].settings)
    with pytest.raises(SystemExit):
        peer_job.parse_runner_args(p, [*base, "--row", "verl_best"], "trl")
    assert "row 'verl_best' is a verl row, not trl's" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        peer_job.parse_runner_args(p, [*base, "--row", "trl_fastest"], "trl")
    rows_named = ("no row 'trl_fastest' (rows: roll_ma, roll_ma_before46, roll_ma_unfused, "
                  "roll_ma_noprefix, roll_ma_level1, roll_ma_async, roll_ma_awake, roll_ma_noahead, "
                  "roll_ma_shared, trl,")
    assert rows_named in capsys.readouterr().err
    with pytest.raises(SystemExit):
        peer_job.parse_runner_args(p, ["--agents", "4", "--agent", "0", "--model", "M"], "trl")
    assert "episodes.turns gives no turns for N = 4" in capsys.readouterr().err


def test_the_smoke_job_is_one_game_a_step_at_the_runs_n(job):
    for n in job.agents:
        small = peer_job.shrink_for_smoke(job, n)
        assert (small.steps, small.warmup_steps, small.episodes.group_size) == (2, 1, 2)
        assert small.groups_per_step(n) == 1 and small.rows_per_step(n) == 2 * job.turns(n) // n
        assert small.rows == job.rows  # the rows' settings are the job's


# ---------------------------------------------------------------------------- the relay job
def test_the_relay_job_is_job_yaml_with_its_overrides(job):
    relay = peer_job.load_job(PEERS / "relay.yaml")
    assert relay.agents == (3, 8) and relay.episodes.relay and relay.prompt.max_prompt_tokens == 1024
    # every other key is job.yaml's: mappings merged key by key (episodes keeps its turns and sizes); its rows
    # are job.yaml's and the AT-GRPO port's (atgrpo, atgrpo_*: they run the relay, test_atgrpo_peer.py)
    assert relay == dataclasses.replace(
        job,
        agents=(3, 8),
        episodes=dataclasses.replace(job.episodes, relay=True),
        prompt=dataclasses.replace(job.prompt, max_prompt_tokens=1024),
        rows={**job.rows, **{name: row for name, row in relay.rows.items() if row.framework == "atgrpo"}},
    )
    game = peer_job.seat_game(relay, 3)
    assert game.relay_reply_chars == relay.episodes.relay_reply_chars == 200
    assert peer_job.seat_game(job, 3).relay_reply_chars == 0  # relay false: replies never reach a prompt
    with pytest.raises(
        ValueError, match=r"relay.yaml: episodes.relay: a turn's prompt carries earlier replies"
    ):
        peer_job.agent_prompts(relay, 3, 0)


def test_a_job_file_inherits_its_parent_key_by_key(tmp_path):
    (tmp_path / "base.yaml").write_text("a: 1\nb: {c: 2, d: [1, 2]}\n")
    (tmp_path / "mid.yaml").write_text("inherit: base.yaml\nb: {c: 3}\n")
    (tmp_path / "top.yaml").write_text("inherit: mid.yaml\nb: {d: [5]}\ne: 4\n")
    assert peer_job._read(tmp_path / "top.yaml") == {"a": 1, "b": {"c": 3, "d": [5]}, "e": 4}


def test_run_all_writes_the_peers_rows_of_a_relay_job_as_not_runnable(tmp_path):
    summary = run_all.main(
        ["--device", "cpu", "--smoke", "--rows", "trl,verl_best@8", "--job", str(PEERS / "relay.yaml"),
         "--model", "unused", "--out-dir", str(tmp_path)]
    )  # fmt: skip
    got = [(r["row"], r["agents"], r["status"], r["step_s"]) for r in summary["rows"]]
    assert got == [("trl", 3, run_all.NOT_RUNNABLE, None), ("trl", 8, run_all.NOT_RUNNABLE, None),
                   ("verl_best", 8, run_all.NOT_RUNNABLE, None)]  # fmt: skip
    assert summary["headline"] == [] and not list(tmp_path.glob("*.log"))  # nothing ran
    md = (tmp_path / "peers.md").read_text()
    assert "| trl | 3 | 1 per agent | 0/0 |" in md and "not runnable: a single-turn trainer" in md
    saved = json.loads((tmp_path / "peers.json").read_text())
    assert all(r["not_runnable"] for r in saved["runs"]) and len(saved["runs"]) == 3


# ---------------------------------------------------------------------------- the prompts and rewards
def test_game_seeds_are_those_roll_mas_planner_plays(job):
    from roll_ma.config.schema import EnvConfig
    from roll_ma.workers.episodes import EpisodePlanner

    env = EnvConfig(name="seat_game:SeatGame", groups_per_step=3, group_size=2)
    planner = EpisodePlanner(env, seed=7)
    for step in (1, 2):
        specs = planner.train_assignments(step, 1)[0]
        assert [s.seed for s in specs] == [peer_job.game_seed(7, step, g) for g in range(3) for _ in range(2)]


def test_each_agent_gets_its_seats_turns_and_together_every_turn(job):
    # 2 games a step at N = 3: 2 x group_size 8 x 3 turns
    small = dataclasses.replace(job, steps=2, episodes=dataclasses.replace(job.episodes, rows_per_step=48))
    assert small.groups_per_step(3) == 2 and small.prompts_per_step(3) == 2
    per_agent = [peer_job.agent_prompts(small, 3, a) for a in range(3)]
    for a, steps in enumerate(per_agent):
        assert len(steps) == 2 and all(len(p) == small.prompts_per_step(3) for p in steps)
        assert all(m[0]["content"] == f"You are seat {a} of 3. Say digits." for p in steps for m in p)
    env = peer_job.seat_game(small, 3)
    turns = []
    for g in range(small.groups_per_step(3)):
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


# ---------------------------------------------------------------------------- each runner: the row's settings
def _real_validate_without_this_machine(monkeypatch):
    """run_config's validation without the checks of this machine (no GPU here, liger-kernel not installed):
    the config a GPU run builds, checked as `--cfg` checks a GPU config on a laptop."""
    from roll_ma.preflight import validate as validate_module

    real = validate_module.validate
    monkeypatch.setattr(
        validate_module, "validate", lambda cfg, check_env=True: real(cfg, check_env, check_local_gpus=False)
    )


def test_roll_ma_config_takes_every_setting_from_its_row(job, tiny_model_dir, tmp_path, monkeypatch):
    _real_validate_without_this_machine(monkeypatch)
    row = job.rows["roll_ma"]
    s = row.settings
    cfg = run_roll_ma.run_config(job, row, 3, tiny_model_dir, "cuda", str(tmp_path))
    assert (cfg.model.gradient_checkpointing, cfg.model.liger_kernel) == (s.gradient_checkpointing, True)
    assert cfg.train.max_tokens_per_micro_batch == s.update_tokens == 8192
    assert cfg.train.score_max_tokens_per_micro_batch == s.scoring_tokens == 32768
    assert cfg.train.remove_padding is (s.attention == "packed") is True
    # the defaults: the KV cache alone freed, a group's prompt once (auto: packed rows, default attention)
    assert cfg.rollout.sleep_level == "kv_cache" and cfg.rollout.backend == "vllm"
    assert cfg.train.share_prompt_prefix == "auto" and cfg.model.attn_implementation is None
    assert run_plan(cfg).shares_prompts
    assert MicroBatching.for_training(run_plan(cfg).worker_train_config(cfg.train)).share_prefix
    # native keys, as roll_ma config keys
    assert (cfg.train.lora_compute_dtype, cfg.train.zero_stage) == ("model", 0)
    assert (cfg.rollout.micro_batch_size, cfg.rollout.per_row_seeds, cfg.env.decode_ahead) == (
        64,
        False,
        True,
    )
    assert cfg.rollout.engine_kwargs == row.native["rollout.engine_kwargs"]
    assert job.rows["roll_ma_unfused"].native["train.lora_compute_dtype"] == "float32"  # the unfused row

    def row_config(name: str):  # noqa: ANN202 - a RunConfig
        return run_roll_ma.run_config(job, job.rows[name], 3, tiny_model_dir, "cuda", str(tmp_path))

    # each lever's row: only its own setting differs from the defaults
    noprefix = row_config("roll_ma_noprefix")
    assert noprefix.train == dataclasses.replace(cfg.train, share_prompt_prefix=False)
    assert not MicroBatching.for_training(noprefix.train).share_prefix
    level1, awake = row_config("roll_ma_level1"), row_config("roll_ma_awake")
    assert (level1.rollout.sleep_level, level1.model, level1.train) == (1, cfg.model, cfg.train)
    assert (awake.rollout.sleep_level, awake.model, awake.train) == (0, cfg.model, cfg.train)
    # the defaults before this: both levers off
    before = row_config("roll_ma_before46")
    assert (before.rollout.sleep_level, before.train, before.model) == (1, noprefix.train, cfg.model)
    assert "sleep KV cache only" in row.describe()
    # other settings in the row: other settings in the config (nothing is a runner's own constant)
    other = _with_settings(row, gradient_checkpointing=True, update_tokens=4096, scoring_tokens=2048,
                           sleep_rollout=False, liger_kernel=False, attention="padded")  # fmt: skip
    cfg = run_roll_ma.run_config(job, other, 3, tiny_model_dir, "cuda", str(tmp_path))
    assert (cfg.model.gradient_checkpointing, cfg.model.liger_kernel, cfg.rollout.sleep_level) == (
        True,
        False,
        0,
    )
    assert (cfg.train.max_tokens_per_micro_batch, cfg.train.score_max_tokens_per_micro_batch) == (4096, 2048)
    assert cfg.train.remove_padding is False


def test_roll_mas_cpu_smoke_drops_only_what_needs_a_gpu(job, tiny_model_dir, tmp_path):
    row = job.rows["roll_ma"]
    cfg = run_roll_ma.run_config(job, row, 3, tiny_model_dir, "cpu", str(tmp_path))
    assert set(run_roll_ma.GPU_ONLY) == {"rollout.engine_kwargs", "rollout.per_row_seeds"}
    assert cfg.model.liger_kernel is False and cfg.rollout.backend == "hf"  # Triton kernels need a GPU
    assert (cfg.rollout.engine_kwargs, cfg.rollout.per_row_seeds) == ({}, True)  # roll_ma's defaults
    assert (cfg.train.lora_compute_dtype, cfg.rollout.micro_batch_size) == ("model", 64)  # the rest kept
    assert cfg.train.max_tokens_per_micro_batch == row.settings.update_tokens
    assert "without liger, sleep and vLLM's engine options" in run_roll_ma.settings_text(row, cuda=False)
    # the relay job: SeatGame's relay game, whose replies reach the next prompts
    relay = peer_job.load_job(PEERS / "relay.yaml")
    cfg = run_roll_ma.run_config(relay, relay.rows["roll_ma"], 3, tiny_model_dir, "cpu", str(tmp_path))
    assert cfg.env.kwargs["relay_reply_chars"] == 200 and cfg.model.max_prompt_tokens == 1024


def test_roll_ma_refuses_a_native_key_the_job_sets(job, tiny_model_dir, tmp_path):
    row = job.rows["roll_ma"]
    for key in ("train.max_tokens_per_micro_batch", "env.kwargs"):
        clash = dataclasses.replace(row, native={**row.native, key: 1})
        with pytest.raises(
            ValueError, match=rf"rows.roll_ma.native sets {re.escape(key)}, which the job sets"
        ):
            run_roll_ma.run_config(job, clash, 3, tiny_model_dir, "cpu", str(tmp_path))


def test_trl_config_takes_every_setting_from_its_row(job, tmp_path, no_rendezvous):
    pytest.importorskip("trl")
    # device "cuda" on this GPU-less machine: the GPU run's mapping; float32, as transformers refuses bf16
    # without a GPU (the dtype is the job's, not the row's)
    job32 = dataclasses.replace(job, dtype="float32")
    prompt_tokens = 136  # the longest prompt with the chat template; a padded row = it + max_new_tokens
    for name in ("trl", "trl_best", "trl_is"):
        row = job.rows[name]
        s = row.settings
        micro = peer_job.micro_batch_rows(64, prompt_tokens + job.generation.max_new_tokens, s.update_tokens)
        cfg = run_trl.grpo_config(job32, row, 64, micro, "cuda", True, str(tmp_path))
        assert (cfg.gradient_checkpointing, cfg.use_liger_kernel) == (
            s.gradient_checkpointing,
            s.liger_kernel,
        )
        assert cfg.vllm_enable_sleep_mode == s.sleep_rollout
        assert cfg.per_device_train_batch_size == micro and cfg.gradient_accumulation_steps == 64 // micro
        assert cfg.vllm_importance_sampling_correction == row.native["vllm_importance_sampling_correction"]
    # trl: 41 rows of 392 tokens fit 16384 (32 divide 64); trl_best: 20 fit 8192 (16 divide 64)
    budgets = [job.rows[n].settings.update_tokens for n in ("trl", "trl_best")]
    assert [peer_job.micro_batch_rows(64, 392, b) for b in budgets] == [32, 16]
    # the CPU smoke: no checkpointing, no liger (GPU-only), whatever the row says
    cpu = run_trl.grpo_config(job, job.rows["trl_best"], 16, 8, "cpu", False, str(tmp_path))
    assert (cpu.gradient_checkpointing, cpu.use_liger_kernel, cpu.use_cpu) == (False, False, True)


def test_trl_refuses_what_its_grpo_cannot_do_and_a_second_source(job, tmp_path, no_rendezvous):
    pytest.importorskip("trl")
    row = job.rows["trl"]
    build = lambda r: run_trl.grpo_config(job, r, 4, 2, "cpu", False, str(tmp_path))  # noqa: E731
    with pytest.raises(ValueError, match=r"rows.trl.settings.attention: TRL 1.16's GRPO pads"):
        build(_with_settings(row, attention="packed"))
    with pytest.raises(ValueError, match=r"rows.trl.settings.scoring_tokens=8192: TRL scores in the update"):
        build(_with_settings(row, scoring_tokens=8192))
    with pytest.raises(ValueError, match=r"rows.trl.native: no_such_field are not GRPOConfig fields"):
        build(dataclasses.replace(row, native={"no_such_field": 1}))
    with pytest.raises(
        ValueError, match=r"rows.trl.native sets beta, per_device_train_batch_size, which the job"
    ):
        build(dataclasses.replace(row, native={"beta": 0.1, "per_device_train_batch_size": 8}))
    with pytest.raises(ValueError, match=r"rows.trl: settings.sleep_rollout=kv_cache is roll_ma's"):
        build(_with_settings(row, sleep_rollout="kv_cache"))


def test_trl_micro_batches_are_the_largest_divisor_of_the_step_in_the_rows_token_budget(job):
    # a padded row = the longest prompt (~136 tokens with the chat template) + max_new_tokens (256)
    row_tokens = 136 + job.generation.max_new_tokens
    trl, best = (job.rows[n].settings.update_tokens for n in ("trl", "trl_best"))
    assert (row_tokens, trl, best) == (392, 16384, 8192)
    assert peer_job.micro_batch_rows(job.rows_per_step(1), row_tokens, trl) == 32  # of 192
    assert peer_job.micro_batch_rows(job.rows_per_step(3), row_tokens, trl) == 32  # of 64
    assert peer_job.micro_batch_rows(job.rows_per_step(8), row_tokens, trl) == 24  # of 24: all of them
    assert peer_job.micro_batch_rows(job.rows_per_step(1), row_tokens, best) == 16  # 20 fit, 16 divide 192
    assert peer_job.micro_batch_rows(job.rows_per_step(8), row_tokens, best) == 12  # of 24
    assert peer_job.micro_batch_rows(192, 512 + 256, 16384) == 16  # 24 x 768 > 16384: 16, not 21
    assert peer_job.micro_batch_rows(6, 20000, 16384) == 1  # no row fits: one row a micro-batch


def test_trl_passes_follow_its_config(job, tmp_path, no_rendezvous):
    pytest.importorskip("trl")
    args = dict(job=job, rows=192, micro=32, device="cpu", use_vllm=True, out_dir=str(tmp_path))
    ours = run_trl.trl_passes(run_trl.grpo_config(row=job.rows["trl"], **args))
    assert "no old log-probs" in ours and "correction off" in ours and "reference log-probs" in ours
    assert "6 training micro-batches" in ours
    trls = run_trl.trl_passes(run_trl.grpo_config(row=job.rows["trl_is"], **args))
    assert "old log-probs (for the vLLM importance-sampling correction)" in trls and "correction on" in trls


def _overrides(lines: list[str]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in lines)


def test_verl_overrides_take_every_setting_from_the_row(job):
    arr = "actor_rollout_ref"
    best = job.rows["verl_best"]
    o = _overrides(run_verl.verl_overrides(job, best, 3, "M", "T", "O", agent=0, longest_prompt=137))
    assert (o[f"{arr}.model.use_liger"], o[f"{arr}.model.enable_gradient_checkpointing"]) == ("True", "False")
    assert o[f"{arr}.actor.ppo_max_token_len_per_gpu"] == str(best.settings.update_tokens) == "8192"
    assert (
        o[f"{arr}.rollout.log_prob_max_token_len_per_gpu"] == o[f"{arr}.ref.log_prob_max_token_len_per_gpu"]
    )
    assert o[f"{arr}.ref.log_prob_max_token_len_per_gpu"] == str(best.settings.scoring_tokens)
    assert o[f"{arr}.rollout.free_cache_engine"] == "True"
    assert o["data.max_prompt_length"] == "137"  # native `longest`: the run's longest prompt
    assert o["algorithm.rollout_correction.bypass_mode"] == "True"
    # verl_best (issue 60): packed rows (remove padding) through torch's varlen kernel, verl's fused kernels
    assert (o[f"{arr}.model.use_remove_padding"], o[f"{arr}.model.use_fused_kernels"]) == ("True", "True")
    assert o[f"{arr}.model.fused_kernel_options.impl_backend"] == "triton"
    assert o[f"+{arr}.model.override_config.attn_implementation"] == "roll_ma_varlen"
    run_verl.check_row(job, best)  # packed rows with another attention named: no flash-attn needed
    # padded rows: sdpa from the runner, no padding removal; the verl row: its own numbers
    padded = job.rows["verl_best_padded"]
    o = _overrides(run_verl.verl_overrides(job, padded, 3, "M", "T", "O", longest_prompt=9))
    assert (o[f"{arr}.model.use_remove_padding"], o[f"{arr}.model.use_fused_kernels"]) == ("False", "True")
    assert o[f"+{arr}.model.override_config.attn_implementation"] == "sdpa"
    before60 = job.rows["verl_best_before60"]
    before = _overrides(run_verl.verl_overrides(job, before60, 3, "M", "T", "O", longest_prompt=9))
    assert f"{arr}.model.use_fused_kernels" not in before and before[f"{arr}.model.use_liger"] == "True"
    o = _overrides(run_verl.verl_overrides(job, job.rows["verl"], 3, "M", "T", "O"))
    assert (o[f"{arr}.model.use_liger"], o[f"{arr}.model.enable_gradient_checkpointing"]) == ("False", "True")
    assert (o[f"{arr}.actor.ppo_max_token_len_per_gpu"], o["data.max_prompt_length"]) == ("16384", "512")
    packed = _with_settings(job.rows["verl"], attention="packed", sleep_rollout=False)
    o = _overrides(run_verl.verl_overrides(job, packed, 3, "M", "T", "O"))
    assert o[f"{arr}.model.use_remove_padding"] == "True" and not any("attn_implementation" in k for k in o)
    assert o[f"{arr}.rollout.free_cache_engine"] == "False"
    with pytest.raises(ValueError, match=r"data.max_prompt_length: longest needs the run's prompts"):
        run_verl.verl_overrides(job, best, 3, "M", "T", "O")
    clash = dataclasses.replace(best, native={"data.train_batch_size": 4})
    with pytest.raises(
        ValueError, match=r"rows.verl_best.native sets data.train_batch_size, which the job sets"
    ):
        run_verl.verl_overrides(job, clash, 3, "M", "T", "O")
    if not peer_job.flash_attn_installed():  # packed rows, no attention named: flash-attn's, absent here
        with pytest.raises(ValueError, match=r"rows.verl.settings.attention=packed: verl's default"):
            run_verl.check_row(job, packed)
    # a padded row naming the attention too: two sources for one setting
    twice = dataclasses.replace(job.rows["verl"], native={run_verl.ATTN_KEY: "eager"})
    with pytest.raises(ValueError, match=r"rows.verl.native sets \+actor_rollout_ref.model.override_config"):
        run_verl.verl_overrides(job, twice, 3, "M", "T", "O")


def test_openrlhf_arguments_take_every_setting_from_the_row(job):
    def value(argv, flag):
        return argv[argv.index(flag) + 1]

    row = job.rows["openrlhf"]
    argv = run_openrlhf.openrlhf_args(job, row, 3, "M", "P", "O", flash_attn=False)
    # micro-batches in rows: the most longest-possible rows (512 + 256 tokens) in 16384 tokens (21) that
    # divide the step's 64 rows: DeepSpeed asserts train_batch = micro x accumulation (21 failed on an H100)
    assert value(argv, "--train.micro_batch_size") == value(argv, "--rollout.micro_batch_size") == "16"
    for agents, rows, micro in ((1, 192, "16"), (8, 24, "12")):
        argv_n = run_openrlhf.openrlhf_args(job, row, agents, "M", "P", "O", flash_attn=False)
        sizes = (value(argv_n, "--train.batch_size"), value(argv_n, "--train.micro_batch_size"))
        assert sizes == (str(rows), micro)
    assert {"--actor.gradient_checkpointing_enable", "--vllm.enable_sleep", "--ds.enable_sleep"} <= set(argv)
    other = _with_settings(row, gradient_checkpointing=False, sleep_rollout=False, update_tokens=3072)
    argv = run_openrlhf.openrlhf_args(job, other, 3, "M", "P", "O", flash_attn=False)
    assert value(argv, "--train.micro_batch_size") == "4"
    assert not {"--actor.gradient_checkpointing_enable", "--vllm.enable_sleep", "--ds.enable_sleep"} & set(
        argv
    )
    # native flags as they are: true the flag, false nothing, else the flag and its value
    native = dataclasses.replace(row, native={"--a.flag": True, "--b.off": False, "--c.num": 3})
    assert run_openrlhf.openrlhf_args(job, native, 3, "M", "P", "O", False)[-3:] == [
        "--a.flag",
        "--c.num",
        "3",
    ]
    clash = dataclasses.replace(row, native={"--train.batch_size": 8})
    with pytest.raises(ValueError, match=r"rows.openrlhf.native sets --train.batch_size, which the job sets"):
        run_openrlhf.openrlhf_args(job, clash, 3, "M", "P", "O", False)


# ---------------------------------------------------------------------------- against the peers' own configs
def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)  # a top-level package: located, not imported
    return Path(spec.origin).parent if spec and spec.origin else None


def test_verl_overrides_compose_with_verls_own_config(job):
    root = _package_dir("verl")
    if root is None:
        pytest.skip("verl is not installed (pip install --no-deps verl==0.9.1 is enough for this check)")
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    overrides = run_verl.verl_overrides(job, job.rows["verl"], 3, "/m", "/t.parquet", "/o")
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
    # verl_best (issue 60): packed rows through roll_ma_varlen, the fused kernels, as verl's config reads them
    best = run_verl.verl_overrides(job, job.rows["verl_best"], 3, "/m", "/t.parquet", "/o", longest_prompt=9)
    with initialize_config_dir(config_dir=str(root / "trainer" / "config"), version_base=None):
        cfg = OmegaConf.to_container(compose(config_name="ppo_trainer", overrides=best), resolve=True)
    model = cfg["actor_rollout_ref"]["model"]
    assert (model["use_remove_padding"], model["use_fused_kernels"], model["use_liger"]) == (True, True, True)
    assert model["fused_kernel_options"] == {"impl_backend": "triton"}
    assert model["enable_gradient_checkpointing"] is False
    assert model["override_config"] == {"attn_implementation": "roll_ma_varlen"}
    assert cfg["actor_rollout_ref"]["actor"]["use_fused_kernels"] is True  # the actor follows the model's
    run_verl.check_row(job, job.rows["verl_best"])  # every native key is one of this verl's
    # the shared run: one adapter, every seat's prompts of a step in one batch (= one optimizer step)
    shared = run_verl.verl_overrides(job, job.rows["verl"], 3, "/m", "/t.parquet", "/o", agent=None)
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
    packed = _with_settings(job.rows["verl_best"], attention="packed")
    for row, legacy, agent in [
        (job.rows["verl"], True, 0),
        (job.rows["verl_best"], False, None),
        (packed, False, 0),
    ]:
        overrides = run_verl.verl_overrides(job, row, 3, "/m", "/t.parquet", "/o", legacy, agent, 137)
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
    # the verl rows skip the old-log-prob forward (bypass_mode, native); verl's default runs it
    verl = job.rows["verl"]
    passes = run_verl.verl_passes(job, verl)
    assert "old log-probs: none" in passes and "adapter off" in passes
    recompute = dataclasses.replace(verl, native={"data.max_prompt_length": 512})
    assert "old log-probs: a separate forward" in run_verl.verl_passes(job, recompute)
    assert "algorithm.rollout_correction.bypass_mode=True" in run_verl.verl_overrides(
        job, verl, 3, "M", "T", "O"
    )
    assert not any("bypass_mode" in o for o in run_verl.verl_overrides(job, recompute, 3, "M", "T", "O"))


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
    argv = run_openrlhf.openrlhf_args(job, job.rows["openrlhf"], 3, "/m", "/p.jsonl", "/o", flash_attn=False)
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
    overrides = run_verl.verl_overrides(job, job.rows["verl"], 3, tiny_model_dir, str(path), str(tmp_path))
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


def test_each_peer_imports_its_own_site_packages_first(tmp_path, monkeypatch):
    # the folders are named site-packages: dill (datasets' fingerprint) pickles other modules by value
    for name in ("trl", "common"):
        (tmp_path / name / "site-packages").mkdir(parents=True)
    paths = run_all.runner_env("trl", tmp_path)["PYTHONPATH"].split(os.pathsep)
    own, shared = (str(tmp_path / name / "site-packages") for name in ("trl", "common"))
    assert paths[:3] == [own, shared, str(run_all.REPO)]
    assert str(run_all.REPO) == run_all.runner_env("verl", tmp_path)["PYTHONPATH"].split(os.pathsep)[0]
    # one GPU per run, and none of the caller's rendezvous (each launcher sets its own)
    monkeypatch.setenv("RANK", "3")
    env = run_all.runner_env("trl", None, "1")
    assert env["CUDA_VISIBLE_DEVICES"] == "1" and "RANK" not in env


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


def test_openrlhf_names_the_failure_that_shows_first():
    arch = "  File \"builder.py\", line 708\nValueError: invalid literal for int() with base 10: '0a'\n"
    assert "cannot read an arch-specific" in run_openrlhf.upstream_failure(arch)
    assert "no nvcc" in run_openrlhf.upstream_failure(
        "OSError: CUDA_HOME environment variable is not set. Please set it to your CUDA install root."
    )
    # the engine's refusal as Ray passes it on (quotes escaped), after the weights' first tensor is sent
    sync = (
        "(LLMRayActor pid=7) update weight: base_model.model.model.embed_tokens.weight, dtype: bf16\n"
        "ray.exceptions.RayTaskError(Exception): Call to collective_rpc method failed: There is no module or "
        "parameter named \\'base_model\\' in Qwen2ForCausalLM. The available parameters ...\n"
    )
    assert run_openrlhf.upstream_failure(sync).startswith("OpenRLHF#1349 (3): broadcast_to_vllm")
    # the earliest is the cause: a dtype refusal before the names' is #1349's first blocker
    dtype = "Worker failed with error 'mismatch dtype: src torch.float32, dst torch.bfloat16'\n"
    assert run_openrlhf.upstream_failure(dtype + sync).startswith("OpenRLHF#1349 (1)")
    assert run_openrlhf.upstream_failure("Traceback\nRuntimeError: something else\n") is None


def test_openrlhf_arch_list_is_plain_for_deepspeeds_jit_build():
    assert run_openrlhf.plain_arch_list("9.0a") == "9.0"
    assert run_openrlhf.plain_arch_list(" 8.0 9.0a;9.0 10.0f+PTX ") == "8.0;9.0;10.0+PTX"
    for arch in ("9.0", "8.0;9.0+PTX"):  # every entry DeepSpeed's sort key reads (builder.py:708)
        for cc in run_openrlhf.plain_arch_list(arch).split(";"):
            assert all(int(part.split("+")[0]) >= 0 for part in cc.split("."))


def test_openrlhf_finds_the_nvcc_a_jit_build_would_run(tmp_path):
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text("")
    (cuda / "bin" / "nvcc").chmod(0o755)  # PATH's search takes executables only
    empty = str(tmp_path / "nothing")
    assert run_openrlhf.nvcc_path({"CUDA_HOME": str(cuda), "PATH": empty}) == str(cuda / "bin" / "nvcc")
    # CUDA_HOME names the toolkit: no nvcc there is none, whatever PATH holds (as torch's build sees it)
    assert run_openrlhf.nvcc_path({"CUDA_HOME": empty, "PATH": str(cuda / "bin")}) is None
    assert run_openrlhf.nvcc_path({"PATH": str(cuda / "bin")}) == str(cuda / "bin" / "nvcc")


def test_openrlhf_adapter_evidence_is_read_per_step():
    out = "\n".join(
        [
            "✨ Global step 1: {'kl': 0.0, 'vllm_kl': 0.0004, 'timing/step_total': 80.0}",
            "✨ Global step 2: {'kl': 0.02, 'vllm_kl': 0.0005, 'timing/step_total': 40.0}",
            "✨ Global step 3: {'kl': 0.03, 'timing/step_total': 40.0}",
        ]
    )
    evidence = run_openrlhf.adapter_evidence(run_openrlhf.parse_steps(out))
    assert evidence == {"vllm_kl": [0.0004, 0.0005, None], "kl": [0.0, 0.02, 0.03]}


def test_openrlhf_source_still_has_the_failures_the_runner_names():
    """What the runner's docstring says of OpenRLHF's source, checked where it is installed: no torch_adam
    in its DeepSpeed optimizer config, no LoRA in its vLLM engines, and the PEFT model's own parameters
    (no merge) in its weight sync. A release that changes one of these makes this fail, and the names."""
    root = _package_dir("openrlhf")
    if root is None:
        pytest.skip(
            "openrlhf is not installed (pip install --no-deps openrlhf==0.11.2 is enough for this check)"
        )
    strategy = (root / "utils" / "deepspeed" / "deepspeed.py").read_text()
    assert '"type": "AdamW"' in strategy and "torch_adam" not in strategy
    engines = (root / "trainer" / "ray" / "vllm_engine.py").read_text()
    assert "enable_lora" not in engines and "LoRARequest" not in engines
    actor = (root / "trainer" / "ray" / "ppo_actor.py").read_text()
    sync = actor[actor.index("def broadcast_to_vllm(self):") : actor.index("class PolicyModelActor")]
    assert "model.named_parameters()" in sync and "merge" not in sync


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


def _run(row, agents, step_s, agent=None, repeat=0, gpu=H100, **more):
    """One runner's result as run_one records it (the driver's identity fields included)."""
    framework = row.split("_")[0] if not row.startswith("roll_ma") else "roll_ma"
    return {"row": row, "framework": framework, "agents": agents, "agent": agent, "shared": False,
            "repeat": repeat, "step_s": step_s, "gpu_name": gpu, "gpu_index": str(repeat % 2),
            **more}  # fmt: skip


def test_result_lines_and_the_combined_row(job):
    lines = "noise\nJSON " + json.dumps({"step_s": 2.0}) + "\nJSON " + json.dumps({"step_s": 3.0}) + "\ntail"
    assert peer_job.read_result(lines) == {"step_s": 3.0} and peer_job.read_result("none") is None
    assert peer_job.is_oom("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate")
    runs = [
        _run("trl", 2, 2.0, agent=0, step_min_s=1.5, step_max_s=2.5, response_tokens_per_step=100.0,
             gpu_peak_gb=50.0, phases_s={"rollout": 1.0}, first_step_end_s=90.0),
        _run("trl", 2, 3.0, agent=1, step_min_s=2.0, step_max_s=4.0, response_tokens_per_step=150.0,
             gpu_peak_gb=60.0, oom=False, phases_s={"rollout": 2.0}, first_step_end_s=80.0),
        _run("roll_ma", 2, 2.5, response_tokens_per_step=250.0),
        _run("verl", 2, None, agent=0, error="ValueError: x", oom=True, gpu=None),
        _run("openrlhf", 2, 4.0, agent=0, response_tokens_per_step=100.0),
        {**_run("roll_ma", 2, 2.0), "shared": True},
        {**_run("trl", 2, 3.0), "shared": True, "gpu_name": H200},
    ]  # fmt: skip
    ours, trl, verl, openrlhf, ours_shared, trl_shared = run_all.table_rows(job, runs, 1)
    assert (trl["row"], trl["agents"], trl["adapters"]) == ("trl", 2, "1 per agent")
    assert (trl["step_s"], trl["spread_s"], trl["tokens_per_s"], trl["repeats"]) == (
        5.0,
        [5.0, 5.0],
        50.0,
        "1/1",
    )
    assert (trl["gpu_peak_gb"], trl["vs_roll_ma"], trl["phases_s"], trl["gpu"]) == (
        60.0,
        2.0,
        {"rollout": 3.0},
        H100,
    )
    assert (trl["status"], ours["vs_roll_ma"], ours["repeats"]) == ("ok", 1.0, "1/1")
    assert trl["first_step_end_s"] == 90.0 and ours["first_step_end_s"] is None  # the slowest run's start
    assert trl["settings"] == job.rows["trl"].describe() and trl["about"] == job.rows["trl"].about
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
    assert (ours_shared["adapters"], trl_shared["adapters"], trl_shared["step_s"]) == (
        "1 shared",
        "1 shared",
        3.0,
    )
    assert trl_shared["vs_roll_ma"] is None and ours_shared["vs_roll_ma"] == 1.0
    # a later call's run replaces the same (row, N, agent, shared, repeat), keeps the others
    merged = run_all.merge_runs(runs, [_run("verl", 2, 6.0, agent=0)])
    assert len(merged) == len(runs) and merged[-1]["step_s"] == 6.0
    again = run_all.merge_runs(merged, [_run("verl", 2, 7.0, agent=0, repeat=1)])
    assert len(again) == len(runs) + 1  # another repeat: kept beside the first


def test_a_row_is_the_median_of_its_repeats_medians_with_their_spread(job):
    runs = [_run("roll_ma", 1, s, repeat=k) for k, s in enumerate([2.0, 2.6, 2.2])]
    runs += [_run("trl", 3, s, agent=a, repeat=k) for k, s in enumerate([1.0, 1.2, 1.1]) for a in range(3)]
    runs += [_run("trl", 1, s, agent=0, repeat=k) for k, s in enumerate([3.0, 5.0])]
    runs += [_run("trl", 1, None, agent=0, repeat=2, error="RuntimeError: died")]
    ours, trl1, trl3 = run_all.table_rows(job, runs, 3)
    assert (ours["step_s"], ours["spread_s"], ours["repeats"]) == (2.2, [2.0, 2.6], "3/3")
    assert ours["repeat_step_s"] == [2.0, 2.6, 2.2] and ours["repeat_gpus"] == ["0", "1", "0"]
    # a peer's repeat sums its N runs; the row is the median of those sums
    assert (trl3["step_s"], trl3["spread_s"], trl3["repeats"]) == (3.3, [3.0, 3.6], "3/3")
    # a failed repeat counts in neither the median nor the spread, and the row says what failed
    assert (trl1["step_s"], trl1["spread_s"], trl1["repeats"]) == (4.0, [3.0, 5.0], "2/3")
    assert trl1["status"] == "RuntimeError: died"
    assert trl1["vs_roll_ma"] == round(4.0 / 2.2, 2)


def test_tables_of_one_job_merge_into_one_with_each_runs_repeat_its_place_in_start_order(job, tmp_path):
    """The chains' tables each say repeat 0: merged in start order, a row's runs become repeats 0, 1, 2."""
    calls = [  # (GPU, runs) of each run_all call, in the order they started
        ("0", [_run("roll_ma", 1, 8.5)]),
        ("1", [_run("trl_best", 1, 11.8, agent=0), _run("trl_best", 3, 4.6, agent=0)]),
        ("0", [_run("trl_best", 1, 10.9, agent=0)]),
        ("1", [_run("roll_ma", 1, 7.9)]),
        ("0", [_run("roll_ma", 1, 8.3)]),
    ]
    files = []
    for k, (gpu, runs) in enumerate(calls):
        path = tmp_path / f"t{k}.json"
        path.write_text(json.dumps({"job": job.source, "runs": [{**r, "gpu_index": gpu} for r in runs]}))
        files.append(str(path))
    summary = merge_tables.main([*files, "--repeats", "3", "--out-dir", str(tmp_path / "merged")])
    ours = next(r for r in summary["rows"] if r["row"] == "roll_ma")
    assert ours["repeat_step_s"] == [8.5, 7.9, 8.3] and ours["repeat_gpus"] == ["0", "1", "0"]
    assert (ours["step_s"], ours["spread_s"], ours["repeats"]) == (8.3, [7.9, 8.5], "3/3")
    trl1 = next(r for r in summary["rows"] if r["row"] == "trl_best" and r["agents"] == 1)
    assert trl1["repeat_step_s"] == [11.8, 10.9] and trl1["repeats"] == "2/3"
    assert [(h["roll_ma_row"], h["peer_row"], h["ratio"]) for h in summary["headline"]] == [
        ("roll_ma", "trl_best", round(11.35 / 8.3, 2))]
    assert "| roll_ma | 1 |" in (tmp_path / "merged" / "peers.md").read_text()
    other = tmp_path / "relay.json"
    other.write_text(json.dumps({"job": "benchmarks/peers/relay.yaml", "runs": []}))
    with pytest.raises(SystemExit, match="different jobs"):
        merge_tables.main([files[0], str(other), "--out-dir", str(tmp_path / "x")])
    # a table given twice, or a merge beside its own tables, would count its runs twice: refused
    logged = tmp_path / "logged.json"
    one_run = [_run("roll_ma", 1, 8.5, log="/l/roll_ma_r0.log")]
    logged.write_text(json.dumps({"job": job.source, "runs": one_run}))
    with pytest.raises(SystemExit, match="counts once"):
        merge_tables.main([str(logged), str(logged), "--out-dir", str(tmp_path / "x")])
    with pytest.raises(SystemExit, match="already a merge"):
        merge_tables.main([str(tmp_path / "merged" / "peers.json"), files[0], "--out-dir", str(tmp_path)])
    # what a user can get wrong about a file: one line naming it
    (tmp_path / "notes.md").write_text("| not | json |")
    (tmp_path / "other.json").write_text("{}")
    mistakes = [("missing.json", "cannot read"), ("notes.md", "is not JSON"), ("other.json", "not a run_all")]
    for bad, said in mistakes:
        with pytest.raises(SystemExit, match=said):
            merge_tables.main([str(tmp_path / bad), "--out-dir", str(tmp_path / "x")])


def test_the_headline_puts_each_roll_ma_row_against_each_peers_fastest_row(job):
    steps = {  # row -> its repeats' median step times, all at N = 1
        "roll_ma": [2.0, 2.6, 2.2],  # 2.2 [2.0, 2.6]
        "roll_ma_unfused": [1.8, 1.9, 1.7],  # 1.8 [1.7, 1.9]
        "trl": [5.0, 5.2, 4.8],
        "trl_best": [2.5, 2.7, 3.0],  # TRL's fastest: 2.7 [2.5, 3.0]
        "verl": [1.0, 1.1, 1.2],  # 1.1 [1.0, 1.2]
    }
    runs = [_run(row, 1, s, agent=None if row.startswith("roll_ma") else 0, repeat=k)
            for row, times in steps.items() for k, s in enumerate(times)]  # fmt: skip
    runs += [_run("openrlhf", 1, 0.5, agent=0, gpu=H200)]  # another GPU model: never compared
    got = [(h["roll_ma_row"], h["peer_row"], h["ratio"], h["verdict"]) for h in run_all.headline(
        run_all.table_rows(job, runs, 3))]  # fmt: skip
    assert got == [
        ("roll_ma", "trl_best", 1.23, "tie (spreads overlap)"),  # [2.0, 2.6] and [2.5, 3.0] overlap
        ("roll_ma", "verl", 0.5, "verl faster"),
        ("roll_ma_unfused", "trl_best", 1.5, "roll_ma faster"),
        ("roll_ma_unfused", "verl", 0.61, "verl faster"),
    ]


def test_the_plan_runs_n_first_then_each_repeat_of_every_row_in_the_order_given(job):
    rows = run_all.parse_rows(job, "roll_ma_unfused,trl,openrlhf@1")
    assert rows == [("roll_ma_unfused", None), ("trl", None), ("openrlhf", {1})]
    plan = run_all.plan_runs(job, rows, [1, 3], repeats=2)
    expected = []
    for k in range(2):
        expected += [
            ("roll_ma_unfused", 1, None, False, k),
            ("trl", 1, 0, False, k),
            ("openrlhf", 1, 0, False, k),
        ]
    for k in range(2):
        expected += [("roll_ma_unfused", 3, None, False, k)]
        expected += [("trl", 3, a, False, k) for a in range(3)]
    assert plan == expected
    # a row with adapters: shared is one run at every N, whatever the framework (the job file says so)
    shared = run_all.plan_runs(job, run_all.parse_rows(job, "roll_ma_shared,trl_shared"), [8], repeats=1)
    assert shared == [("roll_ma_shared", 8, None, True, 0), ("trl_shared", 8, None, True, 0)]
    assert [(r[0], r[1]) for r in run_all.plan_runs(job, [("verl", {3})], [1, 3], 1)] == [
        ("verl", 3)
    ] * 3
    assert run_all.parse_rows(job, None) == [(name, None) for name in job.rows]
    rows_are = ("the job's rows are roll_ma, roll_ma_before46, roll_ma_unfused, "
                "roll_ma_noprefix, roll_ma_level1, roll_ma_async, roll_ma_awake, roll_ma_noahead, "
                "roll_ma_shared, trl")
    with pytest.raises(ValueError, match=rows_are):
        run_all.parse_rows(job, "roll_ma,deepspeed-chat")


def test_each_run_reaches_its_runner_as_that_row_with_no_setting_of_the_drivers(job):
    gpu = argparse.Namespace(job=None, device="cuda", smoke=False)
    tail = lambda *run, args=gpu: run_all.runner_command(*run, "M", args)[2:]  # noqa: E731
    assert run_all.runner_command(job.rows["trl_is"], 3, 1, False, "M", gpu)[1].endswith("run_trl.py")
    assert tail(job.rows["trl_is"], 3, 1, False) == [
        "--agents", "3", "--model", "M", "--row", "trl_is", "--agent", "1", "--device", "cuda"]  # fmt: skip
    assert tail(job.rows["roll_ma_unfused"], 3, None, False) == [
        "--agents", "3", "--model", "M", "--row", "roll_ma_unfused", "--device", "cuda"]  # fmt: skip
    # a shared row's run: no --agent and no flag of the driver's (the runner reads adapters: shared)
    assert tail(job.rows["trl_shared"], 8, None, True) == [
        "--agents", "8", "--model", "M", "--row", "trl_shared", "--device", "cuda"]  # fmt: skip
    with pytest.raises(ValueError, match=r"rows.verl_best: a shared run of a row with adapters: per_agent"):
        tail(job.rows["verl_best"], 3, None, True)
    assert tail(job.rows["openrlhf"], 1, 0, False)[-3:] == ["--agent", "0", "--flash-attn-shim"]
    cpu = argparse.Namespace(job="relay.yaml", device="cpu", smoke=True)
    assert tail(job.rows["trl"], 3, 2, False, args=cpu) == [
        "--agents", "3", "--model", "M", "--row", "trl", "--job", "relay.yaml", "--agent", "2",
        "--device", "cpu", "--smoke", "--no-vllm"]  # fmt: skip


def test_repeats_go_to_another_gpu_than_their_previous_repeat_and_the_gpus_stay_balanced(job):
    rows = run_all.parse_rows(job, "roll_ma,trl,verl")
    plan = run_all.plan_runs(job, rows, [1, 3], repeats=3)
    queues = run_all.assign_gpus(job, plan, ["0", "1"])
    assert sorted(r for q in queues.values() for r in q) == sorted(plan)  # every run, once
    gpu_of = {run: g for g, q in queues.items() for run in q}
    for name, n, agent, shared, k in plan:
        if k:
            assert gpu_of[(name, n, agent, shared, k)] != gpu_of[(name, n, agent, shared, k - 1)]

    def minutes(run):
        name, n, agent, _, _ = run
        framework = job.rows[name].framework
        return run_all.RUN_MINUTES.get((framework, framework == "roll_ma" or agent is None or n == 1), 5.0)

    load = [sum(minutes(r) for r in q) for q in queues.values()]
    assert abs(load[0] - load[1]) <= max(map(minutes, plan))
    # each GPU keeps the plan's order: whole repeats of the first N start first
    for q in queues.values():
        assert q == [r for r in plan if r in q]
    assert run_all.assign_gpus(job, plan, [None]) == {None: plan}  # one GPU: every repeat on it


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
    names = ["roll_ma"] + (["trl"] if importlib.util.find_spec("trl") else [])
    summary = run_all.main(
        ["--device", "cpu", "--smoke", "--rows", ",".join(names), "--agents", "3", "--repeats", "1",
         "--out-dir", str(tmp_path)]
    )  # fmt: skip
    rows = {r["row"]: r for r in summary["rows"]}
    assert sorted(rows) == sorted(names)
    for name, row in rows.items():
        assert row["status"] == "ok" and row["step_s"] > 0 and row["tokens_per_s"] > 0, (name, row)
        assert row["repeats"] == "1/1" and row["spread_s"] == [row["step_s"], row["step_s"]]
    md = (tmp_path / "peers.md").read_text()
    assert md.startswith("job: ") and "| row | agents | adapters | repeats | step_s |" in md
    # beside each row what the CPU smoke ran, not the GPU settings it left out
    assert all(row["settings"].startswith("CPU smoke") for row in rows.values()) and "(of: " in md
    runs = [r for r in summary["runs"] if r["framework"] == "trl"]
    assert len(runs) == (3 if "trl" in names else 0)
    # the smoke job: one game of 3 turns a step, 2 samples each: each agent's turn, twice
    assert all(r["rows_per_step"] == 2 and r["rollout"] == "transformers generate" for r in runs)
    assert all(r["micro_batch_rows"] == 2 and "no old log-probs" in r["passes"] for r in runs)
    if runs:  # the headline: roll_ma's row against TRL's (both on this CPU)
        (head,) = summary["headline"]
        assert (head["roll_ma_row"], head["peer_row"]) == ("roll_ma", "trl") and head["ratio"] > 0
    # roll_ma's run carries its own start-up stages beside the common clock's first_step_end_s
    (roll_ma_run,) = [r for r in summary["runs"] if r["framework"] == "roll_ma"]
    assert {"train_model", "rollout_engine", "first_sync", "total"} <= set(roll_ma_run["startup_s"])
    # and the sync's own parts (the HF engine on CPU never sleeps: no wake-up, no vLLM call)
    parts = roll_ma_run["sync_parts_s"]
    assert parts["export"] > 0 and parts["install"] > 0
    assert parts["wake"] is None and parts["install_rpc"] is None
    assert roll_ma_run["mfu"] == {"reference": None, "update": None}  # no peak FLOPs known for a CPU
    assert (roll_ma_run["row"], roll_ma_run["rows_per_step_planned"], roll_ma_run["relay"]) == (
        "roll_ma",
        6,
        False,
    )


def test_the_step_plot_splits_each_step_by_its_own_timers_and_names_the_rest(tmp_path):
    rows = [
        {"framework": "roll_ma", "agents": 1, "shared": False, "step_s": 10.0,
         "phases_s": {"rollout": 3.0, "scoring": 2.0, "update": 4.0, "sync": 0.5}},
        {"framework": "verl", "agents": 3, "shared": True, "step_s": 20.0,
         "phases_s": {"rollout": 4.0, "ref": 6.0, "old_log_prob": 0.1, "update": 8.0, "sync": 1.0}},
        {"framework": "trl", "agents": 1, "shared": False, "step_s": 12.0, "phases_s": None},
        {"row": "roll_ma_unfused", "framework": "roll_ma", "agents": 1, "shared": False, "step_s": 8.0,
         "phases_s": {"rollout": 3.0}},
    ]  # fmt: skip
    ours, verl, trl, fast = plot_steps.pick_rows(
        {"rows": rows}, ["roll_ma@1", "verl@3s", "trl@1", "roll_ma_unfused@1"]
    )
    assert plot_steps.bar_parts(ours)["reference"] == 2.0 and plot_steps.bar_parts(ours)["other"] == 0.5
    assert fast["step_s"] == 8.0  # a row of the job is picked by its name
    verl_parts = plot_steps.bar_parts(verl)
    assert verl_parts["reference"] == 6.0 and verl_parts["old log-probs"] == 0.1
    assert plot_steps.bar_parts(trl) == {**dict.fromkeys(plot_steps.PHASES, 0.0), "no phase timers": 12.0}
    with pytest.raises(SystemExit, match="no measured row 'verl@1'"):
        plot_steps.pick_rows({"rows": rows}, ["verl@1"])


def test_verl_best_max_prompt_length_is_the_longest_prompt_in_tokens(job, tiny_model_dir, tmp_path):
    """``data.max_prompt_length: longest`` is a token count of the rendered chat prompt (transformers 5's
    tokenize=True returns a BatchEncoding whose len() is 2: verl then filtered out every prompt)."""
    from transformers import AutoTokenizer

    prompts = [m for step in peer_job.agent_prompts(job, 1, None) for m in step]
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    each = [
        len(tokenizer(tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True),
                      add_special_tokens=False)["input_ids"])
        for m in prompts
    ]  # fmt: skip
    longest = peer_job.longest_prompt_tokens(tiny_model_dir, prompts)
    assert longest == max(each) > job.prompt.filler_words
    path = run_verl.write_train_file(job, 1, None, tmp_path / "train.parquet")
    overrides = run_verl.verl_overrides(
        job, job.rows["verl_best"], 1, tiny_model_dir, str(path), str(tmp_path), longest_prompt=longest
    )
    assert f"data.max_prompt_length={longest}" in overrides


# ---------------------------------------------------------------------------- issue 60's rows
def test_issue60_roll_ma_rows_differ_from_the_defaults_by_their_lever_alone(
    job, tiny_model_dir, tmp_path, monkeypatch
):
    _real_validate_without_this_machine(monkeypatch)

    def config(name: str, n: int = 8):  # noqa: ANN202 - a RunConfig
        row = job.rows[name]
        return run_roll_ma.run_config(job, row, n, tiny_model_dir, "cuda", str(tmp_path), row.shared)

    ours = config("roll_ma")
    # decode_ahead off: each turn decoded when its prompt is known; nothing else changes
    noahead = config("roll_ma_noahead")
    assert (ours.env.decode_ahead, noahead.env.decode_ahead) == (True, False)
    assert dataclasses.replace(noahead.env, decode_ahead=True) == ours.env
    assert (noahead.train, noahead.model, noahead.rollout) == (ours.train, ours.model, ours.rollout)
    # one adapter shared by every seat: eight agents (one a seat, the prompt naming it) on one adapter,
    # which the plan updates once a step on every seat's rows
    shared = config("roll_ma_shared")
    assert job.rows["roll_ma_shared"].shared and not job.rows["roll_ma"].shared
    assert [a.adapter_name for a in shared.agents] == ["shared"] * 8
    assert [a.adapter_name for a in ours.agents] == [f"agent{i}" for i in range(8)]
    assert {a.adapter for a in run_plan(shared).agents} == {"shared"}
    assert (shared.train, shared.env, shared.rollout) == (ours.train, ours.env, ours.rollout)
    assert "one adapter shared by every seat" in job.rows["roll_ma_shared"].describe()


def test_issue60_trl_rows_set_the_micro_batch_in_rows_and_sleep_from_the_row(job, tmp_path, no_rendezvous):
    pytest.importorskip("trl")
    job32 = dataclasses.replace(job, dtype="float32")
    best = job.rows["trl_best"]
    for rows_, sleep in ((16, True), (16, False), (24, True), (24, False), (32, True), (32, False),
                         (48, True), (48, False)):  # fmt: skip
        row = job.rows[f"trl_mb{rows_}" + ("" if sleep else "_awake")]
        # only the micro-batch and the sleep differ from trl_best
        assert row.settings == dataclasses.replace(best.settings, update_rows=rows_, sleep_rollout=sleep)
        assert row.native == best.native and not row.shared
        micro = run_trl.micro_rows(row, 192, 392)  # N = 1: 192 rows a step, every size divides them
        cfg = run_trl.grpo_config(job32, row, 192, micro, "cuda", True, str(tmp_path))
        assert (cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps) == (rows_, 192 // rows_)
        assert cfg.vllm_enable_sleep_mode is sleep and cfg.use_liger_kernel and not cfg.gradient_checkpointing
        assert f"update {rows_} rows/micro-batch" in row.describe()
    # a row without update_rows keeps the token budget's micro-batch
    assert run_trl.micro_rows(best, 192, 392) == peer_job.micro_batch_rows(192, 392, 8192) == 16
    # trl_best is the search's winner, trl_mb16_awake, wherever 16 rows divide the run's (N = 1 and 3), and
    # trl_best_sleep (the row named trl_best before the search) differs from it in the sleep alone
    winner = job.rows["trl_mb16_awake"]
    assert best.settings == dataclasses.replace(winner.settings, update_rows=None)
    assert [run_trl.micro_rows(best, job.rows_per_step(n), 392) for n in (1, 3)] == [16, 16]
    assert job.rows["trl_best_sleep"].settings == dataclasses.replace(best.settings, sleep_rollout=True)
    # a micro-batch that does not divide the run's rows is refused, naming the key and what divides
    with pytest.raises(ValueError, match=r"rows.trl_mb16.settings.update_rows=16 does not divide this run's "
                                         r"24 rows a step \(1, 2, 3, 4, 6, 8, 12, 24 do\)"):  # fmt: skip
        run_trl.micro_rows(job.rows["trl_mb16"], job.rows_per_step(8), 392)
    # where each size runs: 16 and 32 at N = 1 and 3, 24 and 48 at N = 1 (24 also at N = 8)
    runs_at = {size: [n for n in job.agents if job.rows_per_step(n) % size == 0] for size in (16, 24, 32, 48)}
    assert runs_at == {16: [1, 3], 24: [1, 8], 32: [1, 3], 48: [1]}
    # the shared row: trl_best's settings, one run on every seat's 192 rows
    shared = job.rows["trl_shared"]
    assert shared.shared and shared.settings == best.settings
    assert peer_job.rows_of_run(job, 8, None) == 192 and run_trl.micro_rows(shared, 192, 392) == 16


def test_issue60_runners_check_their_row_before_starting_in_one_line(job, capsys, monkeypatch):
    monkeypatch.delenv("VLLM_USE_FLASHINFER_SAMPLER", raising=False)
    pytest.importorskip("trl")

    def refused(argv, framework, check=None) -> str:  # the parser's one-line error
        with pytest.raises(SystemExit):
            peer_job.parse_runner_args(peer_job.runner_parser(None), argv, framework, check)
        return capsys.readouterr().err.strip().splitlines()[-1]

    base, agent0 = ["--agents", "8", "--model", "M"], ["--agents", "8", "--model", "M", "--agent", "0"]
    mb16 = refused([*agent0, "--row", "trl_mb16"], "trl", run_trl.validate_row)
    assert "update_rows=16 does not divide this run's 24 rows" in mb16
    assert "rows.trl_shared has adapters: shared" in refused([*agent0, "--row", "trl_shared"], "trl")
    per_agent = refused([*base, "--row", "trl_best"], "trl")
    assert "rows.trl_best trains one adapter per agent: give --agent K" in per_agent
    p = peer_job.runner_parser(None)
    args, _, row = peer_job.parse_runner_args(p, [*base, "--row", "trl_shared"], "trl", run_trl.validate_row)
    assert (args.shared, args.agent, row.name) == (True, None, "trl_shared")
    p = peer_job.runner_parser(None, one_agent=False)
    ours = [*base, "--row", "roll_ma_shared"]
    args, _, _ = peer_job.parse_runner_args(p, ours, "roll_ma", run_roll_ma.check_row)
    assert args.shared
    # unknown native keys: each runner's own config names them
    typo = dataclasses.replace(job.rows["roll_ma"], native={"env.decode_ahaed": 1})
    with pytest.raises(ValueError, match=r"rows.roll_ma.native: env.decode_ahaed: unknown key"):
        run_roll_ma.check_row(job, typo, 3)
    with pytest.raises(ValueError, match=r"rows.roll_ma.settings.update_rows=16: roll_ma's micro-batches"):
        run_roll_ma.check_row(job, _with_settings(job.rows["roll_ma"], update_rows=16), 3)
    with pytest.raises(ValueError, match=r"rows.trl.native: no_such_field are not GRPOConfig fields"):
        run_trl.validate_row(job, dataclasses.replace(job.rows["trl"], native={"no_such_field": 1}), 3)
    model = {"use_fused_kernels": False, "override_config": {}}
    verl_config = {"actor_rollout_ref": {"model": model}, "data": {"max_prompt_length": 512},
                   "algorithm": {"rollout_correction": {"bypass_mode": 0}}}  # fmt: skip
    unknown = r"rows.verl_best.native: actor_rollout_ref.model.fused_kernel_options.impl_backend not in verl"
    with pytest.raises(ValueError, match=unknown):
        run_verl.check_row(job, job.rows["verl_best"], 3, verl_config)
    model["fused_kernel_options"] = {"impl_backend": "torch"}
    run_verl.check_row(job, job.rows["verl_best_padded"], 3, verl_config)
    with pytest.raises(ValueError, match=r"rows.verl.settings.update_rows=8: verl's micro-batches"):
        run_verl.check_row(job, _with_settings(job.rows["verl"], update_rows=8), 3, verl_config)
    row = dataclasses.replace(job.rows["openrlhf"], native={"--actor.adam.lrr": 1})
    with pytest.raises(ValueError, match=r"rows.openrlhf.native: --actor.adam.lrr are not flags"):
        run_openrlhf.check_row(job, row, 3, [r"--\w+\.adam\.lr", r"--train\.batch_size"])
    row = dataclasses.replace(row, native={"--actor.adam.lr": 1})
    run_openrlhf.check_row(job, row, 3, [r"--\w+\.adam\.lr"])


def test_issue60_job_keys_adapters_and_update_rows_are_checked(tmp_path):
    with pytest.raises(ValueError, match=r"rows.trl.adapters='one': use per_agent or shared"):
        peer_job.load_job(_write(tmp_path, rows__trl__adapters="one"))
    with pytest.raises(ValueError, match=r"rows.trl.settings.update_rows must be null or an int >= 1, got 0"):
        peer_job.load_job(_write(tmp_path, rows__trl__settings__update_rows=0))
    job = peer_job.load_job(_write(tmp_path, rows__trl__settings__update_rows=None))
    assert job.rows["trl"].settings.update_rows is None and job.rows["trl"].adapters == "per_agent"


def test_a_runner_whose_run_failed_exits_1_with_its_result_line(capsys):
    """A runner started alone tells its shell that the run failed; the result line still says why."""
    def failing_measure():
        raise RuntimeError("model path /nowhere does not exist")

    failed = peer_job.measure_and_emit({"framework": "roll_ma"}, failing_measure)
    assert peer_job.exit_code(failed) == 1 and "model path /nowhere" in failed["error"]
    assert "model path /nowhere" in capsys.readouterr().out  # the result line, printed either way
    ok = peer_job.measure_and_emit({"framework": "roll_ma"}, lambda: {"step_s": 1.0})
    assert peer_job.exit_code(ok) == 0


def test_a_runners_check_says_ok_and_starts_nothing(job, capsys):
    p = peer_job.runner_parser(None, one_agent=False)
    argv = ["--agents", "3", "--model", "/nowhere", "--row", "roll_ma_noahead", "--check"]
    with pytest.raises(SystemExit) as stopped:
        peer_job.parse_runner_args(p, argv, "roll_ma", run_roll_ma.check_row)
    assert stopped.value.code == 0  # the model path is never read
    assert capsys.readouterr().out.strip() == "ok: rows.roll_ma_noahead at N = 3"


def test_run_all_refuses_a_row_its_runner_refuses_before_any_run(tmp_path, capsys):
    """2026-12-02: trl_mb48_awake at N = 3 (48 rows do not divide a run's 64) reached the GPU after the
    runs before it; each run's row is now checked by its own runner first, and nothing starts."""
    pytest.importorskip("trl")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stopped:
        run_all.main(["--device", "cpu", "--rows", "roll_ma,trl_mb48_awake,trl_mb16", "--agents", "3",
                      "--repeats", "2", "--out-dir", str(out)])  # fmt: skip
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    refusal = ("[run_all] refused before any run: trl_mb48_awake at N = 3: rows.trl_mb48_awake.settings."
               "update_rows=48 does not divide this run's 64 rows a step")  # fmt: skip
    assert refusal in err
    assert err.count("refused before any run") == 1  # roll_ma and trl_mb16 pass; one line per (row, N)
    assert not out.exists()  # no model built, no table, no log


def test_run_all_check_only_prints_the_plan_and_runs_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    summary = run_all.main(["--device", "cpu", "--check-only", "--rows", "roll_ma,roll_ma_noahead@8",
                            "--agents", "3,8", "--repeats", "1", "--out-dir", str(out)])  # fmt: skip
    planned = [line.split()[-1] for line in capsys.readouterr().out.splitlines() if "planned:" in line]
    assert planned == ["roll_ma_3agents_r0", "roll_ma_8agents_r0", "roll_ma_noahead_8agents_r0"]
    assert summary == {} and not out.exists()
    # a native key roll_ma's config does not have: refused by its runner, in the runner's words
    bad = _write(tmp_path, rows__roll_ma__native={"env.decode_ahaed": 1})
    with pytest.raises(SystemExit):
        run_all.main(["--device", "cpu", "--check-only", "--job", str(bad), "--rows", "roll_ma",
                      "--agents", "3", "--out-dir", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert "refused before any run: roll_ma at N = 3: " in err and "env.decode_ahaed: unknown key" in err


def test_a_run_cut_by_its_timeout_leaves_its_log_and_no_process(tmp_path):
    """The log is written as the runner prints: a run killed at its timeout (here: one that blocks on a
    pipe nobody writes) keeps what it said, its whole session is gone, and the exit code is None."""
    child = (
        "import os, sys; print('started engine', flush=True); print(os.getpid(), flush=True); "
        "r, w = os.pipe(); os.read(r, 1)"
    )
    log = tmp_path / "run.log"
    env = dict(os.environ)
    output, code = run_all.run_process([sys.executable, "-c", child], env, timeout=3, log_path=log)
    assert code is None
    assert log.read_text() == output and output.startswith("started engine\n")
    pid = int(output.splitlines()[1])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not run_all.LIVE_SESSIONS
    # a run that ends keeps its code, and a long log only its tail
    noisy = f"print('x' * {run_all.LOG_TAIL_CHARS + 10}); print('last line')"
    output, code = run_all.run_process([sys.executable, "-c", noisy], env, timeout=60, log_path=log)
    assert code == 0 and output.endswith("last line\n")
    assert len(log.read_text()) == run_all.LOG_TAIL_CHARS and log.read_text().endswith("last line\n")


def test_a_runner_echoes_its_launchers_lines_as_they_come(tmp_path):
    """A runner (run_verl, run_atgrpo, run_openrlhf) reads its launcher through job.run_logged: each line is
    passed on at once, so a launcher that hangs and is killed by run_all's timeout leaves its log."""
    launcher = "import os; print('vllm server up', flush=True); r, w = os.pipe(); os.read(r, 1)"
    runner = (
        f"import re, sys; sys.path[:0] = {[str(PEERS), str(PEERS.parent)]!r}; import job; "
        f"job.run_logged([sys.executable, '-c', {launcher!r}], {{}}, 'run_x', re.compile('step:'))"
    )
    log = tmp_path / "run.log"
    output, code = run_all.run_process([sys.executable, "-c", runner], dict(os.environ), 5, log)
    assert code is None
    assert output.splitlines()[0].startswith("[run_x] ") and "vllm server up" in output.splitlines()[1:]
    assert log.read_text() == output


def test_verl_logprobs_script_times_verls_unfused_and_fused_log_probs_alike(tmp_path):
    """benchmarks/peers/verl_logprobs.py in verl's environment: every path's log-probs of the same tokens
    agree, and each pass is timed (numbers never checked)."""
    if importlib.util.find_spec("verl") is None:
        pytest.skip("verl is not installed (its environment: benchmarks/peers/requirements-verl.txt)")
    out = tmp_path / "logprobs.json"
    script = PEERS / "verl_logprobs.py"
    args = ["--tokens", "48", "--hidden", "16", "--vocab", "50", "--repeats", "1", "--out", str(out)]
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["path"] for r in rows] == ["unfused", "fused_torch"]
    assert all(r["forward_s"] > 0 and r["forward_backward_s"] > 0 and r["max_abs_diff"] < 1e-4 for r in rows)


def test_verl_logprobs_script_writes_a_failing_paths_error_and_runs_the_rest(monkeypatch, capsys):
    """A path that cannot run (liger's backend without CUTLASS's DSL on an H200, 2026-12-03: the script
    stopped there and the paths before it were lost) writes its error in its row; the paths after it run."""
    if importlib.util.find_spec("verl") is None:
        pytest.skip("verl is not installed (its environment: benchmarks/peers/requirements-verl.txt)")
    spec = importlib.util.spec_from_file_location("verl_logprobs", PEERS / "verl_logprobs.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    real = script.log_probs_fn

    def log_probs_fn(path, weight):
        if path == "fused_liger":
            raise ImportError("cutedsl backend requires the NVIDIA CUTLASS Python DSL")
        return real(path, weight)

    monkeypatch.setattr(script, "log_probs_fn", log_probs_fn)
    args = ["--tokens", "32", "--hidden", "8", "--vocab", "20", "--repeats", "1",
            "--paths", "unfused,fused_liger,fused_torch"]  # fmt: skip
    rows = script.main(args)["rows"]
    assert [r["path"] for r in rows] == ["unfused", "fused_liger", "fused_torch"]
    assert rows[1]["error"] == "ImportError: cutedsl backend requires the NVIDIA CUTLASS Python DSL"
    assert "forward_s" not in rows[1] and rows[2]["forward_s"] > 0 and rows[2]["max_abs_diff"] < 1e-4
    assert "fused_liger failed" in capsys.readouterr().err
