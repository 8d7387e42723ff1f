"""What the train worker ships to the rollout engine: packed adapters equal the plain export."""

import torch
from train_helpers import make_batch, on_policy

from roll_ma.distributed.tensor_transfer import PackedTensors, unpack_tensors


def test_packed_export_equals_the_plain_one_for_every_adapter(make_strategy):
    s = make_strategy(["a0", "a1"])
    s.train_step(on_policy(s, make_batch([0, 1, 0, 1], seed=5), step=1))
    plain = s.adapter_tensors()
    packed = s.adapter_tensors(packed=True)
    assert set(packed) == set(plain) == {"a0", "a1"}
    for name in plain:
        assert isinstance(packed[name], PackedTensors)
        got = unpack_tensors(packed[name])
        assert list(got) == list(plain[name])
        assert all(torch.equal(got[k], plain[name][k]) for k in got)
    assert not all(torch.equal(plain["a0"][k], plain["a1"][k]) for k in plain["a0"])  # two real adapters
