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
