"""A checkpoint lists its files with sizes and SHA-256; resume skips a damaged one; one file mode for all."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from train_helpers import make_batch, on_policy

from roll_ma import checkpoint as ckpt
from roll_ma.errors import RunStartError

AGENTS = ["a0", "a1"]


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def _write(output_dir: Path, step: int, files: dict[str, bytes] | None = None) -> Path:
    """A checkpoint as the pipeline writes it, with small stand-ins for the train workers' files."""
    tmp = ckpt.begin_checkpoint(output_dir, step)
    for rel, data in (files or {"trainer/adapters/a0/adapter_model.safetensors": b"x" * 64,
                                "trainer/optim/a0/rank0.pt": b"y" * 32}).items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_bytes(data)
    return ckpt.finish_checkpoint(tmp, step, {"planner": {"cursor": step}}, keep_last=5)


@pytest.fixture
def saved(make_strategy, tmp_path):
    """A real checkpoint of a two-adapter strategy (adapters in PEFT format, optimizer shards)."""
    s = make_strategy(AGENTS)
    s.train_step(on_policy(s, make_batch([0, 1, 1], seed=3)))
    tmp = ckpt.begin_checkpoint(tmp_path, 1)
    s.save_checkpoint(tmp / "trainer")
    return ckpt.finish_checkpoint(tmp, 1, {"planner": {}}, keep_last=2)


def test_manifest_lists_every_file_with_size_and_sha256(saved):
    from roll_ma.checkpoint_manifest import sha256_file

    manifest = json.loads((saved / "manifest.json").read_text())
    on_disk = sorted(p.relative_to(saved).as_posix() for p in saved.rglob("*") if p.is_file())
    assert sorted(manifest["files"]) == [f for f in on_disk if f not in ("manifest.json", "COMPLETE")]
    assert "trainer/adapters/a1/adapter_model.safetensors" in manifest["files"]
    assert "trainer/optim/a0/rank0.pt" in manifest["files"] and "state.json" in manifest["files"]
    for rel, entry in manifest["files"].items():
        assert entry == {"size": (saved / rel).stat().st_size, "sha256": sha256_file(saved / rel)}
    marker = json.loads((saved / "COMPLETE").read_text())
    assert marker == {"step": 1, "manifest_sha256": sha256_file(saved / "manifest.json")}
    assert ckpt.check_checkpoint(saved).ok


def test_every_file_of_a_checkpoint_gets_the_same_permissions(saved):
    modes = {p.relative_to(saved).as_posix(): oct(_mode(p)) for p in saved.rglob("*") if p.is_file()}
    # safetensors writes 0600 by itself: adapter files must not differ from the rest (0644 under umask 022)
    assert len(set(modes.values())) == 1, modes
    from roll_ma.checkpoint_manifest import new_file_mode

    assert set(modes.values()) == {oct(new_file_mode())}


def test_exported_adapter_dir_is_readable_like_any_new_file(tmp_path):
    import torch

    from roll_ma.checkpoint_manifest import new_file_mode
    from roll_ma.models.adapters import AdapterSpec, write_adapter_dir

    spec = AdapterSpec("a0", 4, 8.0, 0.0, ("q_proj",))
    out = write_adapter_dir({"w": torch.zeros(2)}, spec, tmp_path / "a0")
    assert _mode(out / "adapter_model.safetensors") == _mode(out / "adapter_config.json") == new_file_mode()


@pytest.mark.parametrize(
    "damage, reason",
    [
        (lambda f: f.write_bytes(f.read_bytes()[:10]), "is 10 bytes, the manifest says 64"),
        (lambda f: f.write_bytes(b"z" * 64), "does not match its SHA-256"),
        (lambda f: f.unlink(), "is missing"),
    ],
    ids=["truncated", "changed", "deleted"],
)
def test_resume_skips_a_damaged_newest_checkpoint_and_says_which_and_why(tmp_path, damage, reason):
    _write(tmp_path, 1)
    _write(tmp_path, 2)
    newest = _write(tmp_path, 3)
    damage(newest / "trainer/adapters/a0/adapter_model.safetensors")
    lines: list[str] = []

    step, path = ckpt.resume_checkpoint(tmp_path, log=lines.append)

    assert (step, path.name) == (2, "step_000002")
    assert len(lines) == 1 and "step_000003" in lines[0] and reason in lines[0], lines
    assert "trainer/adapters/a0/adapter_model.safetensors" in lines[0]
    # set aside for inspection: neither resumed from nor pruned nor counted as the latest again
    assert (tmp_path / "checkpoints" / "damaged_step_000003").is_dir() and not newest.exists()
    assert ckpt.latest_checkpoint(tmp_path)[0] == 2


def test_a_damaged_manifest_or_marker_is_caught_too(tmp_path):
    _write(tmp_path, 1)
    bad_manifest = _write(tmp_path, 2)
    manifest = json.loads((bad_manifest / "manifest.json").read_text())
    manifest["files"]["trainer/optim/a0/rank0.pt"]["size"] = 1  # edited so that it agrees with a damaged file
    (bad_manifest / "manifest.json").write_text(json.dumps(manifest))
    bad_marker = _write(tmp_path, 3)
    (bad_marker / "COMPLETE").write_text("{not json")
    lines: list[str] = []
    assert ckpt.resume_checkpoint(tmp_path, log=lines.append)[0] == 1
    text = "\n".join(lines)
    assert "step_000003: its COMPLETE marker cannot be read" in text
    assert "step_000002: manifest.json does not match the checksum in COMPLETE" in text


def test_no_intact_checkpoint_is_a_clear_error_naming_the_directory_and_the_fix(tmp_path):
    for step in (1, 2):
        path = _write(tmp_path, step)
        (path / "trainer/optim/a0/rank0.pt").write_bytes(b"")
    with pytest.raises(RunStartError) as err:
        ckpt.resume_checkpoint(tmp_path, log=lambda line: None)
    text = str(err.value)
    assert str(tmp_path / "checkpoints") in text
    assert "step_000002: trainer/optim/a0/rank0.pt is 0 bytes, the manifest says 32" in text
    assert "step_000001:" in text
    assert "trainer.resume=never" in text and "trainer.output_dir" in text
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001", "step_000002"]


def test_checkpoint_from_before_manifests_is_still_resumed_with_a_note(tmp_path):
    path = _write(tmp_path, 4)
    (path / "manifest.json").unlink()
    (path / "COMPLETE").write_text("4")  # what earlier roll_ma versions wrote
    lines: list[str] = []
    assert ckpt.resume_checkpoint(tmp_path, log=lines.append) == (4, path)
    assert lines == ["[roll_ma] note: checkpoint step_000004: it has no manifest (written by an older "
                     "roll_ma), so it is loaded unchecked"]


def test_no_checkpoint_at_all_is_a_fresh_start(tmp_path):
    assert ckpt.resume_checkpoint(tmp_path, log=lambda line: pytest.fail(line)) is None
    os.makedirs(tmp_path / "checkpoints" / ".tmp_step_000001_abcd")  # a write that was killed
    assert ckpt.resume_checkpoint(tmp_path, log=lambda line: pytest.fail(line)) is None


def test_each_checkpoint_written_is_one_line_with_its_path_and_step(tmp_path):
    lines: list[str] = []
    tmp = ckpt.begin_checkpoint(tmp_path, 3)
    path = ckpt.finish_checkpoint(tmp, 3, {"planner": {}}, keep_last=2, log=lines.append)
    assert lines == [f"[roll_ma] checkpoint written: {tmp_path / 'checkpoints' / 'step_000003'} (step 3)"]
    assert path == tmp_path / "checkpoints" / "step_000003"


def test_each_unfinished_checkpoint_removed_is_one_line_naming_its_step_and_folder(tmp_path):
    # two writes that were killed (a temporary each), one complete checkpoint that stays
    _write(tmp_path, 1)
    killed = [tmp_path / "checkpoints" / name for name in (".tmp_step_000002_ab12cd34", ".tmp_step_000003_e")]
    for folder in killed:
        (folder / "trainer").mkdir(parents=True)
    lines: list[str] = []
    ckpt.prune(tmp_path, keep_last=5, log=lines.append)
    assert lines == [
        f"[roll_ma] removed the unfinished checkpoint of step {step} (its write was cut short): {folder}"
        for step, folder in zip([2, 3], killed)
    ]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_000001"]
    ckpt.prune(tmp_path, keep_last=5, log=lambda line: pytest.fail(line))  # nothing left to say
