"""roll_ma's entries in /dev/shm carry their owner's pid: an owner deletes its own, and whatever a killed
process left is deleted by the next run (``shm_transfer.remove_orphans``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from roll_ma.distributed.shm_transfer import SegmentOwner, remove_orphans, shm_dir


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # reaped: no process has this pid now (until the kernel hands it out again)


def test_entries_of_dead_processes_are_swept_and_live_ones_kept(tmp_path):
    dead, alive = _dead_pid(), os.getpid()
    (tmp_path / f"roll_ma_sync_{dead}_ab12cd34_0_ff").write_bytes(b"x")
    (tmp_path / f"roll_ma_lora_{dead}_k2j4").mkdir()
    (tmp_path / f"roll_ma_lora_{dead}_k2j4" / "alice.v3.4").mkdir()
    (tmp_path / f"roll_ma_sync_{alive}_ab12cd34_0_ff").write_bytes(b"x")
    (tmp_path / f"roll_ma_lora_{alive}_x9").mkdir()
    (tmp_path / "roll_ma_lora_qx2tlg8t").mkdir()  # an older roll_ma's, without a pid: not ours to judge
    (tmp_path / "psm_1234").write_bytes(b"")  # someone else's
    assert remove_orphans(tmp_path) == 2
    kept = [f"roll_ma_sync_{alive}_ab12cd34_0_ff", f"roll_ma_lora_{alive}_x9", "roll_ma_lora_qx2tlg8t",
            "psm_1234"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(kept)


def test_a_vllm_engines_adapter_folder_is_named_by_its_process_and_removed_on_close():
    from roll_ma.inference.vllm_adapters import EngineAdapters

    served = EngineAdapters(llm=None, specs={}, mode="disk")  # the folder is made before any engine call
    root = Path(served.root)
    assert root.parent == shm_dir() and root.name.startswith(f"roll_ma_lora_{os.getpid()}_")
    served.close()
    assert not root.exists()


def test_a_killed_engines_adapter_folder_is_swept_when_the_next_one_starts(tmp_path):
    script = (
        "import os; from roll_ma.inference.vllm_adapters import EngineAdapters; "
        "e = EngineAdapters(llm=None, specs={}, mode='disk'); print(e.root, flush=True); os._exit(0)"
    )  # os._exit: as a kill, nothing of the process runs after it
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    left = Path(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                               check=True).stdout.strip())
    assert left.is_dir()
    from roll_ma.inference.vllm_adapters import EngineAdapters

    served = EngineAdapters(llm=None, specs={}, mode="disk")
    assert not left.exists()
    served.close()


def test_an_owner_deletes_its_files_when_released():
    owner = SegmentOwner("local")
    shared = owner.put(torch.arange(8, dtype=torch.uint8), [("t", "uint8", (8,), 0, 8)])
    assert Path(shared.segment).name.startswith(f"roll_ma_sync_{os.getpid()}_")
    assert owner.release() == 1 and not Path(shared.segment).exists()
