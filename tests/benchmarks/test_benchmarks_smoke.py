"""The padded tokenizer of real-vocab random models, the benchmark helpers, and each benchmark script run
end to end on CPU with the smallest sizes (numbers are never checked, only that they are produced)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))  # the scripts import their helpers as `common`


# ---------------------------------------------------------------------------- padded tokenizer
def test_padded_tokenizer_keeps_encoding_and_decodes_every_id():
    from roll_ma.models.tiny_tokenizer import build_tokenizer

    small, padded = build_tokenizer(), build_tokenizer(pad_vocab_to=1000)
    assert len(padded) == 1000 and len(small) < 1000
    text = "Problem: 37+48\n<|im_start|>user é 😀 <|fill_500|> (Play 0)<|im_end|>"
    assert padded.encode(text) == small.encode(text)  # same merges: no filler is ever produced
    assert max(padded.encode(text)) < len(small)
    for attr in ("eos_token_id", "pad_token_id"):
        assert getattr(padded, attr) == getattr(small, attr)
    assert padded.convert_tokens_to_ids("<|im_start|>") == small.convert_tokens_to_ids("<|im_start|>")
    ids = [len(small), 999]  # the first and the last filler
    assert padded.decode(ids) == f"<|fill_{len(small)}|><|fill_999|>"
    assert padded.decode(small.encode(text)) == small.decode(small.encode(text))
    with pytest.raises(ValueError, match="smaller than the trained vocabulary"):
        build_tokenizer(pad_vocab_to=10)


def test_real_vocab_random_model_gets_a_tokenizer_of_its_vocab_size(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    from roll_ma.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path / "m", vocab_size=151936)
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == AutoConfig.from_pretrained(path).vocab_size == 151936
    assert tok.decode([151935]) == "<|fill_151935|>"
    tiny = build_tiny_model(tmp_path / "tiny")  # the default tiny model is left as it was: no fillers
    assert len(AutoTokenizer.from_pretrained(tiny)) < 512


# ---------------------------------------------------------------------------- helpers
def test_markdown_table_and_planned_runs():
    import common
    import pipeline_scaling

    table = common.markdown_table(["a", "b"], [{"a": 1, "b": 0.123456}, {"a": "x"}])
    assert table.splitlines() == ["| a | b |", "|---|---|", "| 1 | 0.1235 |", "| x | - |"]
    args = pipeline_scaling.parse_args(["--agents", "1,2,4", "--batches", "8,16", "--batch-agents", "2"])
    assert pipeline_scaling.planned_runs(args) == [(1, 8), (2, 8), (4, 8), (2, 16)]
    cpu, gpu = pipeline_scaling.parse_args([]), pipeline_scaling.parse_args(["--device", "cuda"])
    assert cpu.memory_agents == cpu.agents == [1, 2, 4] and gpu.memory_agents == gpu.agents == [1, 2, 4, 8]
    assert pipeline_scaling.planned_runs(gpu) == [(1, 64), (2, 64), (4, 64), (8, 64)]
    # the GPU runs are configured as the shipped 7B configs are
    assert (gpu.turns, gpu.new_tokens, gpu.max_tokens, gpu.eager) == (2, 256, 16384, False)
    assert gpu.targets == ["q_proj", "k_proj", "v_proj", "o_proj"] and cpu.targets is None


def test_pipeline_scaling_summary_skips_the_first_step():
    import pipeline_scaling

    def step(s):
        return {
            "timing/step": s,
            "timing/rollout": s / 2,
            "timing/old_log_probs": 0.1,
            "timing/update": 0.2,
            "timing/sync": 0.05,
            "timing/sync/agent0": 0.01,
            "timing/sync/agent1": 0.03,
            "timing/sync_export": 0.02,
            "timing/sync_install": 0.03,
            "rollout/turns": 16.0,
        }

    last = {**step(3.0), "system/rollout_tokens_per_s": 50.0, "replay/engine_tok_s": 100.0,
            "system/gpu_used_gb_rollout": 30.0, "system/gpu_peak_gb_update": 40.0}
    out = pipeline_scaling.summarize_run([step(100.0), step(1.0), last], agents=2)
    assert out["step_s"] == 2.0 and out["rollout_s"] == 1.0 and out["update_agent_s"] == 0.1
    assert out["sync_adapter_ms"] == pytest.approx(20.0)
    assert (out["sync_export_s"], out["sync_install_s"]) == (0.02, 0.03)
    assert out["other_s"] == pytest.approx(2.0 - (1.0 + 0.1 + 0.2 + 0.05))
    assert out["rollout_vs_engine"] == 0.5 and out["engine_tok_s"] == 100.0 and out["gpu_peak_gb"] == 40.0


def test_gpu_sweep_plans_fixed_work_per_gpu_and_configures_every_gpu(monkeypatch):
    import pipeline_scaling
    from throughput import planned_gpu_runs

    from roll_ma.preflight import validate as validate_module

    args = pipeline_scaling.parse_args(["--device", "cuda", "--gpus", "1,2,4,8", "--agents", "1,8"])
    assert args.gpus == [1, 2, 4, 8] and args.batches == [64]
    assert planned_gpu_runs(args.agents, args.batches[0], args.gpus) == [
        (1, 64, 1), (1, 128, 2), (1, 256, 4), (1, 512, 8), (8, 64, 1), (8, 128, 2), (8, 256, 4), (8, 512, 8)]
    with pytest.raises(SystemExit):  # no 1-GPU run to compare with
        pipeline_scaling.parse_args(["--gpus", "2,4"])
    monkeypatch.setattr(validate_module, "local_gpu_count", lambda: 8)
    args.model, args.dtype = "builtin:tiny", "bfloat16"  # what setup_device and prepare_model would set
    cfg = pipeline_scaling.run_config(args, agents=8, batch=256, out_dir="/tmp/unused", gpus=4)
    assert (cfg.rollout.num_workers, cfg.train.num_workers, cfg.env.num_workers) == (4, 4, 4)
    assert cfg.resources.num_gpus == 4 and cfg.resources.device_mapping == {}  # every role on GPUs 0..3
    assert cfg.env.groups_per_step * cfg.env.group_size == 256
    cpu = pipeline_scaling.parse_args(["--gpus", "1,2"])
    cpu.model, cpu.dtype = "builtin:tiny", "float32"
    cfg = pipeline_scaling.run_config(cpu, agents=2, batch=8, out_dir="/tmp/unused", gpus=2)
    assert (cfg.rollout.num_workers, cfg.train.num_workers, cfg.resources.num_gpus) == (2, 2, 0)


def test_throughput_efficiency_and_plot_from_a_fake_sweep(tmp_path):
    from throughput import add_throughput, plot_throughput

    rows = [  # 64 episodes per GPU; 128 rows of 200 response tokens per GPU
        {"agents": 8, "gpus": 1, "episodes": 64, "step_s": 16.0, "response_tokens": 25600.0},
        {"agents": 8, "gpus": 2, "episodes": 128, "step_s": 20.0, "response_tokens": 51200.0},
        {"agents": 8, "gpus": 8, "episodes": 512, "step_s": 32.0, "response_tokens": 204800.0},
        {"agents": 1, "gpus": 4, "episodes": 256, "step_s": 13.0, "response_tokens": None},  # no 1-GPU run
    ]
    add_throughput(rows)
    assert [r["episodes_per_s"] for r in rows[:3]] == [4.0, 6.4, 16.0]
    assert [r["tokens_per_s"] for r in rows[:3]] == [1600.0, 2560.0, 6400.0]
    assert [r["efficiency"] for r in rows[:3]] == [1.0, 0.8, 0.5] and rows[2]["speedup"] == 4.0
    assert "efficiency" not in rows[3] and rows[3]["tokens_per_s"] is None
    png = plot_throughput(rows, str(tmp_path / "t.png"), "fake sweep")
    assert Path(png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_seat_game_gives_every_seat_its_turns():
    import random

    from seat_game import SeatGame

    env = SeatGame(players=3, turns=6)
    turn, seats = env.reset(seed=1), []
    while turn is not None:
        seats.append(turn.agent)
        result = env.step("12ab")
        turn = result.next_turn
    assert seats == ["agent1", "agent2", "agent0"] * 2 and result.done  # seed 1 starts at seat 1
    assert env.episode_returns() == [1.0, 1.0, 1.0]  # half the characters are digits, twice per seat
    assert env.builtin_action("random", random.Random(0)).isdigit()
    # fewer turns than seats: other seeds start elsewhere, so every seat acts somewhere
    acted = {SeatGame(players=4, turns=2).reset(seed=s).agent for s in range(4)}
    assert acted == {"agent0", "agent1", "agent2", "agent3"}


def test_seat_game_plans_its_turns_unless_they_carry_the_replies():
    from seat_game import SeatGame

    # the plain game: every later turn is known at the first, and stepping gives exactly those turns
    env = SeatGame(players=3, turns=3)
    first = env.reset(seed=0)
    planned = [t.messages for t in env.planned_turns()]
    assert len(planned) == 2 and [env.step("12").next_turn.messages for _ in range(2)] == planned
    assert "said" not in first.messages[1]["content"]
    # the relay game: each prompt carries the last 4 characters of every earlier reply, with its seat
    relay = SeatGame(players=3, turns=3, relay_reply_chars=4)
    turn = relay.reset(seed=0)
    assert turn.messages == first.messages and relay.planned_turns() is None
    second = relay.step("abcdefgh").next_turn
    assert second.messages[1]["content"].endswith("\nseat 0 said: efgh")
    third = relay.step("12").next_turn
    assert third.messages[1]["content"].endswith("\nseat 0 said: efgh\nseat 1 said: 12")
    assert (
        relay.planned_turns() is None and third.messages[0]["content"] == "You are seat 2 of 3. Say digits."
    )
    assert relay.step("9").done and relay.reset(seed=0).messages == first.messages  # replies cleared


def test_multilora_levers_combine_and_baseline_has_no_lora_args():
    import multilora_cost

    args = multilora_cost.parse_args(["--device", "cpu", "--levers", "targets+slots"])
    kwargs, env = multilora_cost.lever_settings("targets+slots+dual_stream", args)
    assert kwargs["lora_target_modules"] == multilora_cost.TARGETS
    assert (kwargs["max_loras"], kwargs["max_lora_rank"]) == (3, 16) and kwargs["enable_lora"]
    assert env == {"VLLM_LORA_ENABLE_DUAL_STREAM": "1"}
    base, _ = multilora_cost.lever_settings("baseline", args)
    assert not base["enable_lora"] and "max_loras" not in base
    with pytest.raises(SystemExit):
        multilora_cost.parse_args(["--levers", "default,nonsense"])


@pytest.mark.parametrize("bad", [["--variants", "packed,nonsense"], ["--group-size", "0"], ["--rows", "0"],
                                 ["--agents", "0"], ["--response-len", "0"], ["--prompt-lens", "100,0"]])
def test_train_mfu_refuses_a_shape_it_cannot_build(bad, capsys):
    import train_mfu

    assert train_mfu.parse_args(["--rows", "4", "--group-size", "2"]).group_size == 2
    with pytest.raises(SystemExit):
        train_mfu.parse_args(bad)
    assert ": error: " in capsys.readouterr().err.strip().splitlines()[-1]  # one line says why


# ---------------------------------------------------------------------------- the scripts, end to end
def run_script(name: str, *args: str, timeout: float = 600) -> str:
    proc = subprocess.run(
        [sys.executable, str(BENCH / name), *args], capture_output=True, text=True, timeout=timeout
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "\nJSON {" in proc.stdout and "machine:" in proc.stdout
    return proc.stdout


def _load(path: Path) -> dict:
    data = json.loads(path.read_text())
    assert data["environment"]["machine"] and data["environment"]["torch"]
    return data


needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm(-cpu) is not installed"
)


def test_packed_attention_script_times_both_attentions_on_the_same_result(tmp_path):
    out = tmp_path / "packed.json"
    args = ["--tokens", "96,33", "--row-len", "20", "--repeats", "1", "--out", str(out)]
    run_script("packed_attention.py", *args)
    rows = _load(out)["rows"]
    assert [(r["attention"], r["tokens"], r["rows"]) for r in rows] == [
        ("sdpa", 96, 5), ("roll_ma_varlen", 96, 5), ("sdpa", 33, 2), ("roll_ma_varlen", 33, 2)]  # fmt: skip
    # the rows kept apart alike by the mask and by the kernel: the same hidden states
    assert all(r["forward_s"] > 0 and r["forward_backward_s"] > 0 and r["max_abs_diff"] < 1e-4 for r in rows)


@pytest.mark.slow
@needs_vllm
def test_rollout_throughput_script(tmp_path):
    # a real-vocab tiny model: ids beyond the trained BPE decode through the padded tokenizer in both backends
    out = tmp_path / "rollout.json"
    run_script(
        "rollout_throughput.py",
        "--vocab-size",
        "151936",
        "--adapters",
        "0,3",
        "--prompts",
        "3",
        "--prompt-len",
        "4",
        "--new-tokens",
        "3",
        "--repeats",
        "1",
        "--out",
        str(out),
    )
    rows = _load(out)["rows"]
    got = {(r["backend"], r["level"], r["adapters"]) for r in rows}
    assert got == {
        (b, lv, n) for b in ("vllm", "hf") for lv, n in [("engine", 0), ("engine", 3), ("generate()", 3)]
    }
    for r in rows:
        if r["level"] == "engine":
            assert r["out_tokens"] == 3 * 3  # exactly K tokens per row: EOS ignored
        assert r["out_tok_s"] > 0


@pytest.mark.slow
@needs_vllm
def test_adapter_sync_script(tmp_path):
    # --full-reload plain: the path vLLM 0.25 on GPU takes (it cannot reload a LoRA-wrapped model in place)
    out = tmp_path / "sync.json"
    run_script("adapter_sync.py", "--repeats", "1", "--full-reload", "plain", "--out", str(out))
    data = _load(out)
    for backend in ("vllm", "hf"):
        ops = {r["operation"]: r for r in data["rows"] if r["backend"] == backend}
        assert {"update_adapters: 1 adapter(s)", "update_adapters: 3 adapter(s)", "full base reload"} <= set(
            ops
        )
        assert data["summary"][f"{backend}_update_3_ms"] > 0
        assert data["summary"][f"{backend}_full_reload_ms"] > 0
    vllm_reload = next(
        r for r in data["rows"] if r["backend"] == "vllm" and r["operation"] == "full base reload"
    )
    assert "plain engine" in vllm_reload["how"]


@pytest.mark.slow
def test_pipeline_scaling_script(tmp_path):
    out = tmp_path / "scaling.json"
    run_script(
        "pipeline_scaling.py",
        "--agents",
        "2",
        "--batches",
        "4",
        "--steps",
        "2",
        "--turns",
        "2",
        "--out",
        str(out),
    )
    data = _load(out)
    (row,) = data["rows"]
    assert (row["agents"], row["episodes"], row["rows"]) == (2, 4, 4 * 2)  # 4 episodes x 2 turns
    assert row["step_s"] > 0 and row["update_agent_s"] == pytest.approx(row["update_s"] / 2)
    assert row["sync_adapter_ms"] is not None  # the rollout's own per-adapter sync times reached the metrics
    (mem,) = data["memory"]
    assert mem["separate_models_GiB"] == pytest.approx(2 * mem["base_params_M"] * 1e6 * 4 / 2**30)


@pytest.mark.slow
def test_pipeline_scaling_gpu_sweep_on_cpu(tmp_path):
    # the --gpus path end to end with CPU workers: 1 and 2 rollout workers and train ranks (gloo)
    out, plot = tmp_path / "sweep.json", tmp_path / "sweep.png"
    run_script("pipeline_scaling.py", "--gpus", "1,2", "--agents", "2", "--batches", "4", "--steps", "2",
               "--turns", "2", "--skip-memory", "--out", str(out), "--plot", str(plot))
    rows = {r["gpus"]: r for r in _load(out)["rows"]}
    assert sorted(rows) == [1, 2] and (rows[1]["episodes"], rows[2]["episodes"]) == (4, 8)
    assert rows[2]["rows"] == 8 * 2 and rows[1]["efficiency"] == 1.0 and rows[2]["efficiency"] > 0
    assert rows[2]["tokens_per_s"] > 0 and plot.stat().st_size > 0


@pytest.mark.slow
@needs_vllm
def test_multilora_cost_script_on_cpu(tmp_path):
    out = tmp_path / "multilora.json"
    run_script(
        "multilora_cost.py",
        "--device",
        "cpu",
        "--shape",
        "tiny",
        "--model-dir",
        str(tmp_path / "m"),
        "--levers",
        "targets+slots,tuned",
        "--decode",
        "3x4x3",
        "--prefill",
        "2x16x2",
        "--repeats",
        "1",
        "--max-model-len",
        "128",
        "--out",
        str(out),
    )
    data = json.loads(out.read_text())
    assert set(data["levers"]) == {"targets+slots"}  # tuned is skipped without --tuned-config-dir
    lever = data["levers"]["targets+slots"]
    assert lever["kwargs"]["lora_target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert [r["adapters"] for r in lever["rows"]] == ["3 mixed", "3 mixed"]
    assert all(r["vs_baseline"] is None for r in data["rows"])  # no baseline measured


@pytest.mark.slow
def test_shared_cpu_runs_script(tmp_path):
    out = tmp_path / "shared.json"
    text = run_script("shared_cpu_runs.py", "--steps", "2", "--counts", "1", "--out", str(out),
                      "env.groups_per_step=2", "env.group_size=2")
    (row,) = json.loads(out.read_text())
    assert row["runs at once"] == 1 and row["update s median"] > 0 and "| runs at once |" in text


# ---------------------------------------------------------------------------- decode against the floor
def test_decode_floor_arithmetic_and_kernel_kinds():
    import decode_floor

    # Qwen2.5-7B in bf16: 15.23 GB of weights, 57,344 B of KV a token; 64 rows at 2,048 + 128 tokens, H200
    sizes = {"weight_bytes": 15.23e9, "kv_bytes_per_token": 57344.0}
    ms = decode_floor.floor_ms(sizes, batch=64, context=2048, new_tokens=256, bandwidth=4.8e12)
    assert ms == pytest.approx(1e3 * (15.23e9 + 64 * 2176 * 57344) / 4.8e12)
    assert 4.8 < ms < 4.9  # weights alone 3.17 ms; the KV cache 1.66 ms more
    assert decode_floor.floor_ms(sizes, 64, 2048, 256, None) is None  # no bandwidth known: no floor
    assert decode_floor.nominal_bandwidth("NVIDIA H200") == 4.8e12
    assert decode_floor.nominal_bandwidth("NVIDIA H100 80GB HBM3") == 3.35e12
    assert decode_floor.nominal_bandwidth("NVIDIA H100 PCIe") == 2.0e12
    assert decode_floor.nominal_bandwidth("Intel Xeon") is None
    kinds = {
        "_lora_shrink_kernel": "lora",
        "void flash::flash_fwd_splitkv_kernel<...>": "attention",  # 'splitk' inside must not make it a GEMM
        "nvjet_hsh_128x64_64x4_1x2_h_bz_coopA_NTN": "gemm",
        "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm>": "gemm",
        "triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0 (rms_norm)": "norm/activation",
        "void vllm::act_and_mul_kernel<...>": "norm/activation",
        "void at::native::(anonymous)::cunn_SoftMaxForward": "sampling",
        "void at::native::elementwise_kernel<128, 4>": "other",
    }
    assert {name: decode_floor.kind_of(name) for name in kinds} == kinds


def test_decode_floor_refuses_bad_flags(capsys):
    import decode_floor

    for bad, says in [
        (["--engines", "lora,fast"], "unknown engine"),
        (["--contexts", "64,x"], "prompt lengths"),
        (["--batch", "0"], "--batch must be at least 1"),
        (["--new-tokens", "1"], "at least 2"),
    ]:
        with pytest.raises(SystemExit):
            decode_floor.parse_args(["--config", "math_selfplay_tiny", *bad])
        assert says in capsys.readouterr().err
    args = decode_floor.parse_args(["--config", "math_selfplay_7b", "model.path=/m", "--profile"])
    assert args.engines == ["lora", "plain", "profile"] and args.overrides == ["model.path=/m"]


def test_decode_floor_shape_comes_from_the_job(tmp_path):
    import decode_floor

    args = decode_floor.parse_args(
        ["--config", "math_selfplay_7b", f"model.path={tmp_path}", "--device", "cpu"]
    )
    cfg = decode_floor.load_job(args)
    # one round of the job: 8 groups x 8 episodes, 512 new tokens, prompts cut to 2,048 tokens
    assert decode_floor.job_shape(cfg, args) == {"batch": 64, "new_tokens": 512, "contexts": [64, 2048]}
    args = decode_floor.parse_args(
        [
            "--config",
            "math_selfplay_7b",
            f"model.path={tmp_path}",
            "--device",
            "cpu",
            "--batch",
            "8",
            "--contexts",
            "100",
            "--new-tokens",
            "16",
        ]
    )
    assert decode_floor.job_shape(cfg, args) == {"batch": 8, "new_tokens": 16, "contexts": [100]}


@pytest.mark.slow
@needs_vllm
def test_decode_floor_script_on_cpu(tmp_path):
    out = tmp_path / "decode.json"
    text = run_script(
        "decode_floor.py",
        "--config",
        "math_selfplay_tiny",
        "rollout.backend=vllm",
        "--device",
        "cpu",
        "--batch",
        "3",
        "--new-tokens",
        "4",
        "--contexts",
        "8,24",
        "--repeats",
        "1",
        "--engines",
        "lora",
        "--child-timeout-s",
        "1500",  # an engine start on 2 busy cores (one in ~1 min when the machine is quiet)
        "--out",
        str(out),
    )
    data = _load(out)
    assert "error" not in data["engines"]["lora"], data["engines"]["lora"]
    rows = {(r["engine"], r["context"], r["adapters"]): r for r in data["rows"]}
    # the job's engine with no adapter, one and all three mixed (the plain engine is the same code serving no
    # adapters, the profile's engine the same in-process: left out, engine starts are minutes on 2 cores)
    assert set(rows) == {("lora", c, a) for c in (8, 24) for a in ("none", "1 adapter", "3 mixed")}
    assert all(math.isfinite(r["decode_ms"]) for r in rows.values())  # 4 tokens on CPU: a difference of noise
    assert data["engines"]["lora"]["engine_config"]["max_num_seqs"] == 256  # the job's own engine settings
    assert "| lora | 8 | none |" in text


def test_decode_floor_profile_counts_a_steps_work_by_kind():
    import argparse

    import decode_floor
    import torch

    weights = torch.randn(256, 256)

    def generate(context: int, new: int, lora) -> float:  # a stand-in engine: one matmul a token
        x = torch.randn(context, 256)
        for _ in range(new):
            x = torch.mm(x, weights).softmax(-1)
        return 0.001 * new + 0.01  # seconds: 1 ms a step and 10 ms of prefill

    generate(8, 4, None)  # warm-up, as the engine's child does before it profiles
    row = decode_floor.profile_decode(generate, 8, 12, None, argparse.Namespace(device="cpu"))
    assert row["decode_ms"] == pytest.approx(1.0) and row["profiled_new_tokens"] == 12
    # aten::mm and softmax are sorted into their kinds; their times are CPU timings, whose difference between
    # the 12-token and 1-token profiles can go below 0 on a busy machine (it did, in this file's run): counts
    # are what a test can hold, the milliseconds are the script's to print
    assert isinstance(row["gemm_ms"], float) and isinstance(row["sampling_ms"], float)
    assert row["kernels_per_step"] >= 2  # aten::mm and the softmax ops, every step
    assert row["busy"] == pytest.approx(row["kernel_ms"] / row["decode_ms"])


def test_env_side_script_times_the_env_workers_own_work(tmp_path, capsys):
    import env_side

    out = tmp_path / "env.json"
    result = env_side.main(["--config", "math_selfplay_tiny", "--steps", "2", "--profile", "--out", str(out),
                            "env.groups_per_step=2", "env.group_size=2"])
    rows = result["rows"]
    # 4 episodes of solver, critic, refiner: 12 rows in 3 rounds a step; the stand-in's decoding timed apart
    assert [(r["rows"], r["rounds"]) for r in rows] == [(12, 3), (12, 3)]
    assert all(0 < r["env_side_s"] < r["total_s"] for r in rows)
    assert "encode_chat" in result["profile"] and json.loads(out.read_text())["summary"]["rows"] == 12
    with pytest.raises(SystemExit):
        env_side.parse_args(["--config", "math_selfplay_tiny", "--steps", "0"])
