"""benchmarks/peers/run_roll_ma.py's output folder: a temporary one is removed when the run ends and never
named in what the run prints (its last line once named a folder that was gone); --out-dir keeps one."""

from __future__ import annotations

import sys
from pathlib import Path

PEERS = Path(__file__).resolve().parents[2] / "benchmarks" / "peers"
sys.path[:0] = [str(PEERS), str(PEERS.parent)]

import run_roll_ma  # noqa: E402


def test_a_temporary_folder_is_removed_and_never_printed(capsys):
    with run_roll_ma.run_folder(None) as out_dir:
        print(f"[roll_ma] done: checkpoint {out_dir}/checkpoints/step_000002, metrics {out_dir}/m.jsonl")
        print(f"[roll_ma] warning: {out_dir}/logs", file=sys.stderr)
    said = capsys.readouterr()
    assert not Path(out_dir).exists() and out_dir not in said.out + said.err
    assert said.out.splitlines() == [
        "[roll_ma] the run's folder is temporary, removed at its end (<temporary folder> below); "
        "--out-dir DIR keeps it",
        "[roll_ma] done: checkpoint <temporary folder>/checkpoints/step_000002, metrics "
        "<temporary folder>/m.jsonl",
    ]
    assert said.err == "[roll_ma] warning: <temporary folder>/logs\n"


def test_out_dir_keeps_the_folder_and_its_lines_name_it(tmp_path, capsys):
    with run_roll_ma.run_folder(str(tmp_path / "kept")) as out_dir:
        Path(out_dir).mkdir()
        print(f"[roll_ma] done: metrics {out_dir}/metrics.jsonl")
    assert out_dir == str(tmp_path / "kept") and Path(out_dir).is_dir()
    assert capsys.readouterr().out == f"[roll_ma] done: metrics {tmp_path / 'kept'}/metrics.jsonl\n"
