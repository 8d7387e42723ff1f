"""Packed tensors: every dtype and shape comes back bit-exact, as independent writable tensors."""

import numpy as np
import torch
from safetensors.torch import save_file

from roll_ma.distributed.tensor_transfer import pack_tensors, unpack_tensors


def test_pack_round_trip_is_bit_exact_for_every_dtype_and_shape(tmp_path):
    gen = torch.Generator().manual_seed(0)
    tensors = {
        "lora_A.fp32": torch.randn(4, 8, generator=gen),
        "lora_B.bf16": torch.randn(8, 4, generator=gen).to(torch.bfloat16),
        "half": torch.randn(3, generator=gen).half(),
        "transposed": torch.randn(5, 3, generator=gen).t(),  # not contiguous
        "ids": torch.arange(7, dtype=torch.int64),
        "flags": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
    }
    packed = pack_tensors(tensors)
    assert packed.buffer.dtype == np.uint8
    assert packed.buffer.nbytes == sum(t.numel() * t.element_size() for t in tensors.values())
    packed.buffer.setflags(write=False)  # what a reader of Ray's object store gets
    out = unpack_tensors(packed)
    assert list(out) == list(tensors)
    for name, t in tensors.items():
        assert out[name].dtype == t.dtype and out[name].shape == t.shape
        assert torch.equal(out[name], t), name
    # each tensor owns its storage: writable, and safetensors (vLLM's adapter files) accepts them
    ptrs = {out[n].untyped_storage().data_ptr() for n in out if out[n].numel()}
    assert len(ptrs) == sum(1 for t in out.values() if t.numel())
    out["lora_A.fp32"].add_(1.0)
    save_file({k: v for k, v in out.items() if v.numel()}, str(tmp_path / "adapter.safetensors"))


def test_pack_of_nothing():
    assert unpack_tensors(pack_tensors({})) == {}


def test_shared_segment_is_read_by_another_process_and_unlinked_on_release():
    """The same-node adapter hand-over: one process writes a shared-memory file, another reads it
    bit-exact (and leaves it when it exits), the owner's release removes it; a dead owner's files go."""
    import subprocess
    import sys
    from pathlib import Path

    from roll_ma.distributed.shm_transfer import SegmentOwner
    from roll_ma.distributed.tensor_transfer import pack_on_device

    tensors = {
        "a": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "b": torch.tensor([1, 2], dtype=torch.int8),
    }
    owner = SegmentOwner("local")
    shared = owner.put(*pack_on_device(tensors, torch.bfloat16))
    reader = (
        "import sys, json, torch\n"
        "from roll_ma.distributed.shm_transfer import SharedTensors, read_shared\n"
        "s = SharedTensors(*json.loads(sys.argv[1]))\n"
        "print(json.dumps({k: v.float().tolist() for k, v in read_shared(s).items()}))\n"
    )
    import json

    for _ in range(2):  # the first reader's exit must not have unlinked it
        arg = json.dumps([shared.segment, shared.nbytes, shared.entries, shared.node_id])
        out = subprocess.run([sys.executable, "-c", reader, arg], capture_output=True, text=True, check=True)
        assert json.loads(out.stdout) == {"a": [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], "b": [1.0, 2.0]}
    assert Path(shared.segment).exists()
    assert owner.release() == 1 and not Path(shared.segment).exists()
    # a file left by a process that is gone is removed by the next owner on the node
    orphan = Path(shared.segment).parent / "roll_ma_sync_999999999_deadbeef_0_abc"
    orphan.write_bytes(b"x")
    SegmentOwner("local")
    assert not orphan.exists()
