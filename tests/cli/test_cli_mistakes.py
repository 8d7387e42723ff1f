"""A user's mistakes on the command line, as a user meets them: exit 2, one message in config words naming
the file and line, the override or the key, no traceback, and Ray never started. A run with nothing left to
do says so in one line (exit 0), also without Ray."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from roll_ma.cli import main

REPO = Path(__file__).resolve().parents[2]
TINY = ["--config_name", "math_selfplay_tiny"]


def _launch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "start_pipeline.py"), *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )


def _one_message(res: subprocess.CompletedProcess) -> str:
    """The one error message of a refused run (exit 2), after checking that nothing else was said."""
    said = res.stdout + res.stderr
    assert res.returncode == 2, said
    assert "Traceback" not in said and "started a local Ray" not in said, said
    assert res.stderr.count("error:") == 1 and res.stderr.startswith("error: "), said
    return res.stderr


def test_a_yaml_mistake_in_the_users_own_config_is_its_file_line_and_column(tmp_path):
    (tmp_path / "mine.yaml").write_text("name: mine\nmodel:\n  path: builtin:tiny\n   dtype: float32\n")
    message = _one_message(_launch(tmp_path, "--config_path", str(tmp_path), "--config_name", "mine"))
    assert f"{tmp_path / 'mine.yaml'}:4:9: not valid YAML: mapping values are not allowed here" in message
    assert "   dtype: float32" in message


def test_an_override_that_cannot_be_read_is_named_without_the_plus_advice(tmp_path):
    message = _one_message(_launch(tmp_path, *TINY, "env.seats=[solver,critic"))
    assert "  - env.seats=[solver,critic: cannot be read: '[solver,critic' (an unclosed bracket" in message
    assert "+key" not in message


def test_an_output_dir_under_a_file_is_named_before_anything_starts(tmp_path):
    (tmp_path / "taken").write_text("a file")
    message = _one_message(_launch(tmp_path, *TINY, f"trainer.output_dir={tmp_path / 'taken' / 'run'}"))
    assert (
        f"  - trainer.output_dir: {tmp_path / 'taken' / 'run'} cannot be created: {tmp_path / 'taken'} "
        "is a file, not a folder"
    ) in message
    assert not list(Path(tmp_path).glob("**/error_*.log"))  # nothing failed inside: no log to look for


def test_a_model_folder_with_a_cut_short_config_json_is_told_so(tmp_path, tiny_model_dir):
    model = tmp_path / "model"
    model.mkdir()
    for f in Path(tiny_model_dir).iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    text = (model / "config.json").read_text()
    (model / "config.json").write_text(text[: len(text) // 2])
    message = _one_message(
        _launch(tmp_path, *TINY, f"model.path={model}", f"trainer.output_dir={tmp_path}/o")
    )
    assert f"  - model.path: {model / 'config.json'} is not valid JSON: " in message
    assert "cut short" in message and "give a model directory with a config.json" not in message


@pytest.mark.parametrize(
    "override, words",
    [
        ("trainer.max_steps=-5", "trainer.max_steps: must be 1 or more: a run trains the steps up to"),
        ("model.path={file}", "model.path: {file} is a file, not a model folder"),
        ("model.path={folder}", "model.path: {folder} holds no config.json (it is empty)"),
        ("trainer.output_dir={file}", "trainer.output_dir: {file} is a file, not a folder"),
        ("model.path=${{nope}}", "model.path: Interpolation key 'nope' not found (set by the override"),
        ("trainer.nope=1", "trainer.nope: unknown key"),
        ("trainer.max_steps=[1,2]", "trainer.max_steps: must be an integer, got list"),
    ],
    ids=["zero-steps", "model-file", "model-empty-folder", "output-file", "interpolation", "unknown", "type"],
)
def test_each_mistake_is_one_message_and_exit_2_before_ray(tmp_path, capsys, no_ray, override, words):
    (tmp_path / "file").write_text("x")
    (tmp_path / "folder").mkdir()
    paths = {"file": tmp_path / "file", "folder": tmp_path / "folder"}
    out = [] if override.startswith("trainer.output_dir") else [f"trainer.output_dir={tmp_path / 'out'}"]
    code = main([*TINY, *out, override.format(**paths)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1 and words.format(**paths) in err, err


def test_a_finished_run_says_so_in_one_line_without_ray(tmp_path, capsys, no_ray):
    from checkpoint_helpers import finished_checkpoint

    from roll_ma.preflight.config_loader import load_config

    out = tmp_path / "out"
    overrides = [f"trainer.output_dir={out}", "trainer.max_steps=3"]
    finished_checkpoint(load_config("math_selfplay_tiny", overrides=overrides), 3, {"planner": {}})
    assert main([*TINY, *overrides]) == 0
    said = capsys.readouterr()
    assert said.err == "" and said.out.splitlines()[-1] == (
        f"[roll_ma] step 3 of 3 already done in {out}; raise trainer.max_steps to continue"
    )
