"""Pre-flight of resume: the checkpoint ``trainer.resume=auto`` would continue from records what of the config
its tensors depend on; a config that changed any of it is refused before Ray starts, naming each key with
its old and new value and both fixes. Keys that may change resume fine."""

from __future__ import annotations

import json

import pytest

from roll_ma import checkpoint as ckpt
from roll_ma.errors import PreflightError
from roll_ma.preflight import run_preflight
from roll_ma.preflight.checkpoint_compat import run_signature
from roll_ma.preflight.config_loader import load_config

FIXES = ("Start afresh with trainer.resume=never (moves the previous run's files aside), or give this run "
         "another trainer.output_dir.")


def config(tmp_path, name="math_selfplay_tiny", overrides=()):
    return load_config(name, overrides=[f"trainer.output_dir={tmp_path / 'out'}", *overrides])


def save_checkpoint(cfg, step=4, signature=True) -> str:
    """A checkpoint as the pipelines write it (the trainer's files are not needed by this check)."""
    tmp = ckpt.begin_checkpoint(cfg.trainer.output_dir, step)
    (tmp / "trainer").mkdir()
    path = ckpt.finish_checkpoint(tmp, step, {"planner": {}}, keep_last=2,
                                  signature=run_signature(cfg) if signature else None)
    return path.name


def test_the_signature_is_a_file_of_the_checkpoint_listed_in_its_manifest(tmp_path):
    cfg = config(tmp_path)
    step_dir = tmp_path / "out" / "checkpoints" / save_checkpoint(cfg)
    signature = json.loads((step_dir / ckpt.SIGNATURE_FILE).read_text())
    assert signature["model.path"] == "builtin:tiny"
    assert signature["agents"] == ["solver", "critic", "refiner"]
    assert signature["adapters.solver.rank"] == cfg.lora.rank
    manifest = json.loads((step_dir / "manifest.json").read_text())
    assert ckpt.SIGNATURE_FILE in manifest["files"]


def test_resuming_after_changing_the_lora_rank_names_the_key_and_both_fixes(tmp_path, no_ray):
    from roll_ma.pipelines import run_training

    old = config(tmp_path)
    name = save_checkpoint(old)
    new = config(tmp_path, overrides=[f"lora.rank={old.lora.rank * 2}", "agents.1.lora.alpha=4"])
    with pytest.raises(PreflightError) as err:
        run_training(new)  # the CLI's and roll_ma.train's entry
    (problem,) = err.value.problems
    assert problem == (
        f"trainer.output_dir={tmp_path / 'out'} holds a checkpoint of another config ({name}); "
        "trainer.resume=auto would continue from it, but:\n"
        f"      lora.rank: {old.lora.rank} in the checkpoint, {old.lora.rank * 2} now (adapters solver, "
        "critic, refiner)\n"
        f"      agents[1].lora.alpha: {old.lora.alpha} in the checkpoint, 4.0 now (adapter critic)\n"
        f"    {FIXES}"
    )


def test_resuming_after_switching_the_critic_share_is_refused(tmp_path, no_ray):
    old = config(tmp_path, "marft_tiny")
    save_checkpoint(old)
    with pytest.raises(PreflightError) as err:
        run_preflight(config(tmp_path, "marft_tiny", ["critic.share=false"]))
    (problem,) = err.value.problems
    assert "\n      critic.share: true in the checkpoint, false now\n" in problem and problem.endswith(FIXES)
    with pytest.raises(PreflightError, match="algorithm.advantage: \"gae\" in the checkpoint, \"grpo\" now"):
        run_preflight(config(tmp_path, "marft_tiny", ["algorithm.advantage=grpo"]))


def test_other_recorded_keys_are_compared_too(tmp_path, no_ray):
    save_checkpoint(config(tmp_path))
    new = config(tmp_path, overrides=["model.dtype=bfloat16", "agents.2.name=fixer", "agents.2.kind=refiner",
                                      "lora.target_modules=[q_proj,v_proj]"])
    with pytest.raises(PreflightError) as err:
        run_preflight(new)
    text = str(err.value)
    assert 'model.dtype: "float32" in the checkpoint, "bfloat16" now' in text
    assert 'agents: ["solver", "critic", "refiner"] in the checkpoint, ["solver", "critic", "fixer"] now' \
        in text
    assert "lora.target_modules: [" in text


def test_keys_that_may_change_resume_fine_and_the_learning_rate_gets_a_note(tmp_path, no_ray):
    save_checkpoint(config(tmp_path))
    notes: list[str] = []
    allowed = ["trainer.max_steps=500", "trainer.save_every=7", "trainer.log_every=3", "train.lr=1e-5",
               "rollout.temperature=0.7", "env.group_size=2", "train.micro_batch_size=4",
               "algorithm.kl_coef=0.1", "reference.mode=worker", "algorithm.advantage=reinforce_pp",
               "tracking.tensorboard=false", "lora.dropout=0.1"]
    run_preflight(config(tmp_path, overrides=allowed), log=notes.append)
    assert len(notes) == 1 and notes[0].startswith("[roll_ma] note: resuming from step_000004: train.lr: ")
    assert "the resumed optimizer continues the checkpoint's learning-rate schedule" in notes[0]
    run_preflight(config(tmp_path, overrides=["trainer.resume=never", "lora.rank=64"]))  # nothing resumes


def test_a_checkpoint_from_before_signatures_resumes_with_a_note(tmp_path, no_ray):
    save_checkpoint(config(tmp_path), signature=False)
    notes: list[str] = []
    run_preflight(config(tmp_path, overrides=["lora.rank=64"]), log=notes.append)
    assert notes == ["[roll_ma] note: checkpoint step_000004 has no run_signature.json (written by an older "
                     "roll_ma): its agents, adapters and LoRA settings are not compared with this config"]


def test_a_refused_resume_prints_no_resuming_from_note_first(tmp_path, no_ray):
    save_checkpoint(config(tmp_path))
    notes: list[str] = []
    with pytest.raises(PreflightError, match="lora.rank"):  # train.lr alone would resume with a note
        run_preflight(config(tmp_path, overrides=["train.lr=1e-5", "lora.rank=64"]), log=notes.append)
    assert notes == []


def test_the_check_compares_the_checkpoint_the_run_will_resume_from(tmp_path, no_ray):
    """A damaged newest checkpoint is skipped by resume; the check looks past it, as resume does."""
    old = config(tmp_path)
    save_checkpoint(old, step=4)
    other = config(tmp_path, overrides=["lora.rank=64"])
    newest = tmp_path / "out" / "checkpoints" / save_checkpoint(other, 5)
    (newest / "rng.pt").write_bytes(b"cut short")
    notes: list[str] = []
    run_preflight(old, log=notes.append)  # step 4 matches this config: the damaged step 5 is not compared
    assert notes == []
    with pytest.raises(PreflightError, match=r"holds a checkpoint of another config \(step_000004\)"):
        run_preflight(config(tmp_path, overrides=["lora.rank=64"]))
    (tmp_path / "out" / "checkpoints" / "step_000004" / "state.json").write_text("{}")
    with pytest.raises(PreflightError) as err:  # none intact: said before Ray, not after
        run_preflight(old)
    assert "no intact checkpoint to resume from" in str(err.value)
    said = str(err.value)
    assert "\n      - step_000005: rng.pt is 9 bytes" in said and "step_000004: state.json" in said
    assert "\n    Start this run from scratch with trainer.resume=never" in said  # under its problem
