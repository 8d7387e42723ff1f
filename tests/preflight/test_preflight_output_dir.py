"""The output folder before Ray starts: one that cannot be written is one problem naming trainer.output_dir
and why; a run whose checkpoint already holds every step (or phase) says so in one line and starts nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from checkpoint_helpers import finished_checkpoint

import roll_ma
from roll_ma.config.phase_plan import plan_phases
from roll_ma.errors import PreflightError
from roll_ma.preflight.config_loader import load_config
from roll_ma.preflight.output_dir import output_dir_problems


def test_a_writable_folder_new_or_existing_is_no_problem_and_is_left_as_it_was(tmp_path):
    assert output_dir_problems(str(tmp_path / "new" / "run")) == []
    assert not (tmp_path / "new").exists()  # checking creates nothing
    assert output_dir_problems(str(tmp_path)) == [] and list(tmp_path.iterdir()) == []


def test_a_file_or_a_folder_under_a_file_is_named(tmp_path):
    (tmp_path / "f").write_text("x")
    assert output_dir_problems(str(tmp_path / "f")) == [
        f"trainer.output_dir: {tmp_path / 'f'} is a file, not a folder; give trainer.output_dir a folder "
        "this user can write to (it is created when missing)"
    ]
    (problem,) = output_dir_problems(str(tmp_path / "f" / "run"))
    assert problem.startswith(
        f"trainer.output_dir: {tmp_path / 'f' / 'run'} cannot be created: "
        f"{tmp_path / 'f'} is a file, not a folder"
    )


def test_a_file_where_the_run_writes_a_folder_and_a_dangling_link_are_named(tmp_path):
    (tmp_path / "checkpoints").write_text("x")
    (problem,) = output_dir_problems(str(tmp_path))
    assert f"{tmp_path / 'checkpoints'} must be a folder" in problem
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    (problem,) = output_dir_problems(str(tmp_path / "link"))
    assert "which does not exist" in problem


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs a folder nobody can write: Linux's /proc")
def test_a_folder_that_cannot_be_written_is_named_with_the_reason(tmp_path):
    # why /proc: a chmod-ed folder is writable for root, which CI containers often are
    (problem,) = output_dir_problems("/proc/roll_ma_run")
    assert problem.startswith(
        "trainer.output_dir: /proc/roll_ma_run cannot be created: /proc cannot be written ("
    )


def test_the_run_refuses_an_unwritable_output_dir_before_ray(tmp_path, no_ray):
    (tmp_path / "f").write_text("x")
    with pytest.raises(PreflightError) as err:
        roll_ma.train("math_selfplay_tiny", trainer__output_dir=str(tmp_path / "f" / "run"))
    assert str(err.value).startswith("the run cannot start (1 problem):\n  - trainer.output_dir: ")


def test_a_finished_run_says_so_in_a_line_and_returns_its_last_metrics_without_ray(tmp_path, capsys, no_ray):
    overrides = [f"trainer.output_dir={tmp_path}", "trainer.max_steps=2"]
    cfg = load_config("math_selfplay_tiny", overrides=overrides)
    finished_checkpoint(cfg, 2, {"planner": {}})
    (tmp_path / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "a": 1}) + "\n" + json.dumps({"step": 2, "a": 2}) + "\n"
    )
    assert roll_ma.train("math_selfplay_tiny", trainer__output_dir=str(tmp_path), trainer__max_steps=2) == {
        "step": 2,
        "a": 2,
    }
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"[roll_ma] step 2 of 2 already done in {tmp_path}; raise trainer.max_steps to continue"
    )
    roll_ma.train("math_selfplay_tiny", trainer__output_dir=str(tmp_path), trainer__max_steps=1)
    assert "step 2 already done" in capsys.readouterr().out
    assert (tmp_path / "checkpoints" / "step_000002").is_dir()  # nothing moved, nothing written


def test_a_finished_phase_run_says_so_and_returns_its_results_without_ray(tmp_path, capsys, no_ray):
    cfg = load_config("math_reflection_tiny", overrides=[f"trainer.output_dir={tmp_path}"])
    phases = plan_phases(cfg)
    results = {phases[-1].name: {"eval/p1@t1": 0.5, "step": 7.0}}
    finished_checkpoint(cfg, 7, {"phase": len(phases), "progress": {}, "planner": {}, "results": results})
    assert roll_ma.train("math_reflection_tiny", trainer__output_dir=str(tmp_path)) == results
    assert "already done in" in capsys.readouterr().out
