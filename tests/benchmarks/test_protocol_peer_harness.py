"""benchmarks/protocol_compat: the name-only shim imports under verl's and ROLL's module names, and the
runner counts and explains results. Written against small test files of our own (no peer code)."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "benchmarks" / "protocol_compat"

VERL_STYLE = """
import numpy as np
import pytest
import torch
from verl import DataProto
from verl.protocol import pad_dataproto_to_divisor, union_numpy_dict, serialize_tensordict


def test_renamed_arguments_reach_roll_ma():
    d = DataProto.from_dict(tensors={"x": torch.arange(3)}, non_tensors={"t": ["a", "b", "c"]})
    assert d.repeat(repeat_times=2).non_tensor_batch["t"].tolist() == ["a", "a", "b", "b", "c", "c"]
    assert d.select(non_tensor_batch_keys=["t"]).non_tensor_batch["t"].tolist() == ["a", "b", "c"]
    padded, pad = pad_dataproto_to_divisor(d, size_divisor=2)
    assert pad == 1 and len(padded) == 4
    assert DataProto(batch=None, non_tensor_batch={"t": np.array([1], dtype=object)}).non_tensor["t"][0] == 1


def test_chunk_concat():
    raise AssertionError("a failure listed in docs/dataproto.md")
"""

ROLL_STYLE = """
from roll.distributed.scheduler.protocol import DataProto, custom_np_concatenate


def test_made_up_failure():
    custom_np_concatenate([])
"""


def test_runner_counts_passes_and_marks_documented_failures(tmp_path):
    verl_file, roll_file, out = tmp_path / "v.py", tmp_path / "r.py", tmp_path / "out.json"
    verl_file.write_text(textwrap.dedent(VERL_STYLE))
    roll_file.write_text(textwrap.dedent(ROLL_STYLE))
    cmd = [sys.executable, str(HARNESS / "run_peer_suites.py"), "--verl-file", str(verl_file)]
    cmd += ["--roll-file", str(roll_file), "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True)
    assert "## verl: 1/2 passed" in run.stdout and "## roll: 0/1 passed" in run.stdout
    assert "failed, documented     test_chunk_concat" in run.stdout
    assert "NotImplementedError: roll_ma has no counterpart of 'custom_np_concatenate'" in run.stdout
    summary = json.loads(out.read_text())["summary"]
    assert summary["verl"] == {"passed": 1, "total": 2, "undocumented": []}
    assert summary["roll"]["undocumented"] == ["roll::test_made_up_failure"]


def test_every_documented_difference_names_a_test_of_a_peer_suite():
    sys.path.insert(0, str(HARNESS))
    try:
        from run_peer_suites import documented_tests
    finally:
        sys.path.remove(str(HARNESS))
    names = documented_tests()
    assert len(names) == 11 and "verl::test_chunk_concat" in names and "roll::test_invalid_key" in names


def test_shim_stand_in_and_renamed_class(monkeypatch):
    monkeypatch.syspath_prepend(str(HARNESS / "shim"))
    import peer_names

    d = peer_names.DataProto.from_dict({"x": torch.arange(4)}, {"t": list("abcd")})
    assert d.sample_level_repeat(repeat_times=[1, 0, 0, 2]).non_tensor_batch["t"].tolist() == ["a", "d", "d"]
    d.non_tensor_batch = {"t": np.array(list("wxyz"), dtype=object)}
    assert d.non_tensor["t"].tolist() == list("wxyz")
    assert peer_names.ours_or_missing("union_numpy_dict").__module__ == "roll_ma.protocol.values"
    with pytest.raises(NotImplementedError, match="roll_ma has no counterpart of 'no_such_function'"):
        peer_names.ours_or_missing("no_such_function")(1)
