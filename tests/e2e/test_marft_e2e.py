"""The marft_tiny example end to end on CPU: Reasoner -> Actor, shared critic, team reward, resume. Its first
run goes through the README's launcher (start_pipeline.py's main), standing for the example configs' one-step
run of it (tests/e2e/test_example_configs_run.py)."""

import pytest

from roll_ma.cli import main
from roll_ma.pipelines import run_training
from roll_ma.preflight.config_loader import load_config
from roll_ma.tracking import read_metrics

pytestmark = pytest.mark.slow


def test_marft_tiny_runs_and_resumes_with_its_critic(ray_session, tmp_path, capsys):
    small = ["env.groups_per_step=2", "env.group_size=4", "trainer.eval_every=0", "trainer.save_every=1",
             "critic.warmup_steps=1", f"trainer.output_dir={tmp_path}", "trainer.progress_bars=false"]
    rc = main(["--config_name", "marft_tiny", *small, "trainer.max_steps=2"])
    printed = capsys.readouterr()
    assert rc == 0, printed.err[-3000:]
    assert "[roll_ma] done: " in printed.out
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for key in ("critic/explained_var", "critic/value_critic/value_loss",
                    "critic/value_critic/value_clip_frac", "agent/reasoner/reward_trained",
                    "agent/actor/reward_trained", "rollout/env/correct"):
            assert key in r, key
        assert r["critic/value_critic/value_loss"] > 0 and -1e6 < r["critic/explained_var"] <= 1.0
        # team reward: the reasoner trains on the actor's reward
        assert r["agent/reasoner/reward_trained"] == pytest.approx(r["agent/actor/reward"])
        assert r["agent/reasoner/reward_shared"] == 1.0
    assert rows[0]["agent/reasoner/updated"] == 0.0  # critic warm-up: only the critic trained at step 1
    assert rows[1]["agent/reasoner/updated"] == 1.0
    ckpt = tmp_path / "checkpoints" / "step_000002" / "trainer"
    assert (ckpt / "adapters" / "value_critic").is_dir() and (ckpt / "critic" / "heads.pt").exists()
    # resume: the critic comes back from the checkpoint and step 3 runs
    run_training(load_config("marft_tiny", overrides=small + ["trainer.max_steps=3"]))
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]
