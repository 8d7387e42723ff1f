"""What the train worker ships to the rollout engine: packed adapters equal the plain export."""

from pathlib import Path

import torch
from train_helpers import make_batch, on_policy

from roll_ma.distributed.tensor_transfer import PackedTensors, unpack_tensors
from roll_ma.protocol.requests import UpdateRequest


def test_packed_export_equals_the_plain_one_for_every_adapter(make_strategy):
    s = make_strategy(["a0", "a1"])
    s.train_step(on_policy(s, make_batch([0, 1, 0, 1], seed=5)), UpdateRequest(step=1))
    plain = s.adapter_tensors()
    packed = s.adapter_tensors(packed=True)
    assert set(packed) == set(plain) == {"a0", "a1"}
    for name in plain:
        assert isinstance(packed[name], PackedTensors)
        got = unpack_tensors(packed[name])
        assert list(got) == list(plain[name])
        assert all(torch.equal(got[k], plain[name][k]) for k in got)
    assert not all(torch.equal(plain["a0"][k], plain["a1"][k]) for k in plain["a0"])  # two real adapters


def test_export_after_updates_reads_the_live_weights_in_any_form(make_strategy, tmp_path):
    """The export plan is found once; every later export must still read the weights of that moment,
    cast to the engine's dtype, through the object-store form and the shared-memory form alike."""
    from roll_ma.distributed.shm_transfer import SegmentOwner, SharedTensors, read_shared

    s = make_strategy(["a0", "a1"])
    owner = SegmentOwner("local")
    for step in (1, 2):
        s.train_step(on_policy(s, make_batch([0, 1, 0, 1], seed=step)), UpdateRequest(step=step))
        want = {n: {k: v.to(torch.bfloat16) for k, v in t.items()} for n, t in s.adapter_tensors().items()}
        via_ray = s.adapter_tensors(packed=True, dtype="bfloat16")
        via_shm = s.adapter_tensors(packed=True, dtype="bfloat16", shared=owner)
        for name in want:
            assert isinstance(via_shm[name], SharedTensors)
            for got in (unpack_tensors(via_ray[name]), read_shared(via_shm[name])):
                assert list(got) == list(want[name])
                assert all(got[k].dtype == torch.bfloat16 and torch.equal(got[k], want[name][k]) for k in got)
        assert owner.release() == 2
        segments = [via_shm[n].segment for n in via_shm]
        assert not any(Path(seg).exists() for seg in segments)  # released = deleted
