"""Supervised phases end to end on the tiny test model: every data source, and resume inside a phase giving
the very same adapters as an uninterrupted run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from pipeline_helpers import adapter_tensors_at, load, same_tensors

from roll_ma import checkpoint as ckpt
from roll_ma.pipelines import run_training
from roll_ma.tracking import read_metrics

pytestmark = pytest.mark.slow


def reflection_config(tmp_path: Path, model_dir: str, phases: list[dict], **sections) -> dict:
    cfg = {
        "name": "toy",
        "seed": 0,
        "model": {"path": model_dir, "max_prompt_tokens": 96},
        "lora": {"rank": 4, "alpha": 8},
        "agents": [{"name": "actor"}, {"name": "critic"}],
        "env": {"name": "math_reflection", "max_rounds": 2, "data": {"num_eval_problems": 4}},
        "rollout": {"backend": "hf", "max_new_tokens": 6},
        "teacher": {
            "model": {"path": model_dir, "max_prompt_tokens": 96},
            "rollout": {"backend": "hf", "max_new_tokens": 6},
        },
        "train": {"lr": 0.01, "micro_batch_size": 8},
        "sft": {"source": "file", "path": str(_write_sft(tmp_path)), "batch_size": 2, "epochs": 2},
        "dpo": {"source": "file", "path": str(_write_dpo(tmp_path)), "batch_size": 2, "epochs": 2},
        "phases": phases,
        "reference": {"mode": "none"},
        "trainer": {
            "save_every": 1,
            "keep_last": 50,
            "output_dir": str(tmp_path / "out"),
            "progress_bars": False,
        },
    }
    cfg.update(sections)
    return cfg


def _write_sft(tmp_path: Path) -> Path:
    path = tmp_path / "sft.jsonl"
    rows = [
        {
            "role": "actor" if i % 2 else "critic",
            "messages": [
                {"role": "user", "content": f"Problem: {i}+{i}"},
                {"role": "assistant", "content": f"\\boxed{{{2 * i}}}"},
            ],
        }
        for i in range(8)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _write_dpo(tmp_path: Path) -> Path:
    path = tmp_path / "dpo.jsonl"
    rows = [
        {
            "role": "actor" if i % 2 else "critic",
            "prompt": [{"role": "user", "content": f"Problem: {i}+1"}],
            "chosen": f"\\boxed{{{i + 1}}}",
            "rejected": f"\\boxed{{{i + 2}}}",
        }
        for i in range(8)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_every_source_and_objective_in_one_chain(tmp_path, tiny_model_dir, ray_session):
    phases = [
        {"name": "before", "objective": "eval"},
        {
            "name": "teach",
            "objective": "sft",
            "sft": {"source": "teacher", "problems": 3, "samples_per_problem": 2, "accept": "all"},
        },
        {
            "name": "reject",
            "objective": "sft",
            "agents": ["actor"],
            "sft": {"source": "rejection", "problems": 2, "accept": "all", "epochs": 1},
        },
        {"name": "file_sft", "objective": "sft"},
        {"name": "file_dpo", "objective": "dpo", "dpo": {"reference": "base", "rpo_alpha": 1.0}},
        {
            "name": "loop",
            "objective": "dpo",
            "dpo": {
                "source": "built",
                "iterations": 2,
                "problems_per_iteration": 2,
                "branches": 2,
                "steps_per_iteration": 1,
                "reference": "iteration_start",
            },
        },
        {"name": "after", "objective": "eval"},
    ]
    cfg = load(tmp_path, reflection_config(tmp_path, tiny_model_dir, phases))
    results = run_training(cfg)
    assert set(results) == {"before", "after"}
    assert {"eval/p1@t1", "eval/m1@t2", "eval/p1@t2"} <= set(results["after"])
    rows = read_metrics(Path(cfg.trainer.output_dir) / "metrics.jsonl")
    # teacher rows (accept all: every critique and refinement the teacher wrote): 3 problems x 2 branches
    assert any(r.get("sft/critic/rows") == 6.0 and r.get("sft/actor/rows") == 6.0 for r in rows)
    # the rejection phase trains only the actor
    reject = [r for r in rows if r.get("phase") == 2 and "agent/actor/sft_loss" in r]
    assert reject and all("agent/critic/sft_loss" not in r for r in reject)
    dpo = [r for r in rows if r.get("phase") == 4 and "agent/actor/dpo_loss" in r]
    assert len(dpo) == 4 and all(
        "agent/actor/nll_loss" in r and "agent/critic/rewards/margins" in r for r in dpo
    )
    assert any(r.get("dpo/iteration") == 2.0 for r in rows)
    # a finished run resumes into nothing: no new step, no new line
    lines = len(rows)
    run_training(cfg)
    assert len(read_metrics(Path(cfg.trainer.output_dir) / "metrics.jsonl")) == lines + 0


def test_resume_inside_a_phase_gives_the_same_adapters(tmp_path, tiny_model_dir, ray_session):
    phases = [{"name": "sft", "objective": "sft"}, {"name": "dpo", "objective": "dpo"}]
    cfg = load(tmp_path, reflection_config(tmp_path, tiny_model_dir, phases))
    out = Path(cfg.trainer.output_dir)
    run_training(cfg)
    done = ckpt.complete_checkpoints(out)
    last_step = done[-1][0]
    assert last_step == 4 + 4  # sft: 2 epochs x 2 steps (4 rows per agent, 2 a step); dpo: the same
    full = {a: adapter_tensors_at(out, last_step, a) for a in ("actor", "critic", "actor__ref")}
    for resume_at in (2, 6):  # inside the sft phase; inside the dpo phase (its frozen copy comes back)
        copy = tmp_path / f"resumed_{resume_at}"
        shutil.copytree(out, copy)
        for step, path in ckpt.complete_checkpoints(copy):
            if step > resume_at:
                shutil.rmtree(path)
        cfg2 = load(
            tmp_path, reflection_config(tmp_path, tiny_model_dir, phases), [f"trainer.output_dir={copy}"]
        )
        run_training(cfg2)
        for adapter, tensors in full.items():
            assert same_tensors(adapter_tensors_at(copy, last_step, adapter), tensors), (
                f"resumed at step {resume_at}: {adapter} differs from the uninterrupted run"
            )
        # metrics.jsonl holds every line of the uninterrupted run once (a step may have several lines:
        # its train step, the end of a phase), with the same learning metrics
        assert _lines(copy) == _lines(out), f"resumed at step {resume_at}: metrics.jsonl differs"


def _lines(out: Path) -> list[tuple]:
    return [
        (r["step"], sorted((k, v) for k, v in r.items() if k.startswith("agent/") and not k.endswith("/lr")))
        for r in read_metrics(out / "metrics.jsonl")
    ]


def test_a_file_run_logs_each_step_once_saves_where_asked_and_resumes_past_a_damaged_checkpoint(
    tmp_path, tiny_model_dir, ray_session, capsys
):
    """SFT from a file, 4 steps, trainer.save_every=3: checkpoints at step 3 and at the end, one metrics line
    per step; the newest checkpoint damaged, the rerun falls back to step 3 as the RL loop would."""
    phases = [{"name": "sft", "objective": "sft"}]
    cfg = load(tmp_path, reflection_config(tmp_path, tiny_model_dir, phases),
               ["trainer.save_every=3", "trainer.resume=auto"])
    out = Path(cfg.trainer.output_dir)
    run_training(cfg)
    log = capsys.readouterr().out
    assert [step for step, _ in ckpt.complete_checkpoints(out)] == [3, 4]
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # the start-up: one console line, and its stages on the first line only, as the RL loop logs them
    assert sum(line.startswith("[roll_ma] start-up ") for line in log.splitlines()) == 1, log
    assert {"startup/ray", "startup/workers", "startup/train_model", "startup/rollout_engine",
            "startup/first_sync", "startup/total"} <= set(rows[0])
    assert not any(k.startswith("startup/") for r in rows[1:] for k in r)
    last, metrics, plot = out / "checkpoints" / "step_000004", out / "metrics.jsonl", out / "rewards.png"
    # the phase is named as its objective: its lines say "sft" once
    assert "[roll_ma] sft 4/4: sft_loss " in log and " sft sft" not in log, log
    done = f"[roll_ma] done: checkpoint {last}, metrics {metrics}, plot {plot}"
    assert log.rstrip().splitlines()[-1] == done
    assert plot.read_bytes()[:4] == b"\x89PNG"  # the agents' SFT losses, as an RL run plots its rewards
    # copies: the files are damaged below, and safetensors reads them through a memory map
    full = {a: {k: v.clone() for k, v in adapter_tensors_at(out, 4, a).items()} for a in ("actor", "critic")}
    lines = _lines(out)

    damaged = out / "checkpoints" / "step_000004" / "trainer/adapters/actor/adapter_model.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:100])
    run_training(cfg)
    log = capsys.readouterr().out
    assert "[roll_ma] skipped the damaged checkpoint step_000004" in log, log
    assert f"resumed from {out / 'checkpoints' / 'step_000003'}" in log, log
    assert (out / "checkpoints" / "damaged_step_000004").is_dir()
    assert _lines(out) == lines, "step 4 ran again, logged once"
    for adapter, tensors in full.items():
        assert same_tensors(adapter_tensors_at(out, 4, adapter), tensors), adapter
