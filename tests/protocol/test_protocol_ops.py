"""DataProto operations a verl / ROLL user expects: tensors, object columns, meta_info and empty batches,
each as built, after a pickle and after a Ray put/get (the ``moved`` fixture)."""

import pickle
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from protocol_helpers import assert_same, sample
from tensordict import TensorDict

from roll_ma.protocol import DataProto


@dataclass
class Rollout(DataProto):
    """A subclass with a field of its own: operations must return it, field included."""

    source: str = "env"


def xs(d: DataProto) -> list[float]:
    return d.batch["x"].tolist()


def tags(d: DataProto) -> list[str]:
    return d.non_tensor["tag"].tolist()


def test_index_with_numpy_int_or_0d_tensor_works_like_int(moved):
    d = moved(sample(5))
    for item in (2, np.int64(2), np.int32(2), torch.tensor(2), np.array(2)):
        assert_same(d[item], d[[2]])
    assert xs(d[np.int64(-1)]) == [4.0] and tags(d.select_idxs(torch.tensor(3))) == ["r3"]
    with pytest.raises(ValueError, match="out of range for a batch of 5 rows"):
        d[np.int64(5)]
    with pytest.raises(ValueError, match="1-D int array"):
        d[torch.tensor(1.0)]
    with pytest.raises(ValueError, match="out of range for a batch of 0 rows"):
        moved(sample(0))[np.int64(0)]


def test_pop_removes_in_place_and_returns_the_popped_keys(moved):
    d = moved(sample(4))
    sharing = DataProto(d.batch, d.non_tensor, d.meta_info)  # same containers as d
    popped = d.pop(batch_keys=["lp"], non_tensor_keys="arr", meta_info_keys=["probs", "metrics"])
    assert len(popped) == 4 and list(popped.batch.keys()) == ["lp"] and list(popped.non_tensor) == ["arr"]
    assert_same(popped, sharing.select(["lp"], ["arr"], ["probs", "metrics"]))
    assert "lp" not in d.batch.keys() and "arr" not in d.non_tensor and set(d.meta_info) == {"step", "nested"}
    assert "lp" in sharing.batch.keys() and "probs" in sharing.meta_info  # a batch sharing them keeps them
    with pytest.raises(ValueError, match="pop: no meta_info 'probs'"):
        d.pop(meta_info_keys=["probs"])
    empty = moved(sample(0))
    out = empty.pop(batch_keys="x", non_tensor_keys=["tag"])
    assert len(out) == 0 and list(out.batch.keys()) == ["x"] and "tag" not in empty.non_tensor


def test_rename_tensor_and_object_columns_in_place(moved):
    d = moved(sample(3))
    assert d.rename(["x", "tag"], ["x2", "label"]) is d
    assert d.batch["x2"].tolist() == [0.0, 1.0, 2.0] and d.non_tensor["label"].tolist() == ["r0", "r1", "r2"]
    assert "x" not in d.batch.keys() and "tag" not in d.non_tensor and d.meta_info["step"] == 7
    with pytest.raises(ValueError, match="a column named 'mat' already exists"):
        d.rename("x2", "mat")
    with pytest.raises(ValueError, match="rename: no tensor 'nope'"):
        d.rename("nope", "z")
    assert "label" in moved(sample(0)).rename("tag", "label").non_tensor


def test_reorder_permutes_in_place_like_its_pure_variant_select_idxs(moved):
    d = moved(sample(4))
    before = d.select()
    pure = d.select_idxs([2, 0, 3, 1])
    assert d.reorder(torch.tensor([2, 0, 3, 1])) is d
    assert_same(d, pure)
    assert tags(d) == ["r2", "r0", "r3", "r1"] and d.batch["mat"][:, 0].tolist() == [2, 0, 3, 1]
    assert xs(before) == [0.0, 1.0, 2.0, 3.0]  # the pure variant and copies are untouched
    with pytest.raises(ValueError, match="needs a permutation of 0..3"):
        d.reorder([0, 0, 1, 2])
    empty = moved(sample(0))
    assert len(empty.reorder([])) == 0


def test_split_by_size_then_concat(moved):
    d = moved(sample(5))
    parts = d.split(2)
    assert [xs(p) for p in parts] == [[0, 1], [2, 3], [4]]
    assert [tags(p) for p in parts] == [["r0", "r1"], ["r2", "r3"], ["r4"]]
    parts[0].meta_info["nested"]["a"] = 9  # each piece owns its meta_info
    assert parts[1].meta_info["nested"]["a"] == 1
    assert [len(p) for p in d.split([1, 4])] == [1, 4]
    assert_same(DataProto.concat(d.split(2)), d)
    with pytest.raises(ValueError, match="split size must be >= 1"):
        d.split(0)
    empty = moved(sample(0))
    assert [len(p) for p in empty.split(3)] == [0]  # one empty piece, so concat gives it back
    assert_same(DataProto.concat(empty.split(3)), empty)


def test_make_iterator_covers_every_row_once_per_epoch_and_is_seeded(moved):
    d = moved(sample(6))

    def run(**kwargs):
        return [xs(m) for m in d.make_iterator(4, epochs=2, **kwargs)]

    assert run() == [[0, 1, 2, 3], [4, 5], [0, 1, 2, 3], [4, 5]]
    a = run(shuffle=True, seed=1)
    assert a == run(shuffle=True, seed=1) and a != run(shuffle=True, seed=2)
    assert sorted(a[0] + a[1]) == sorted(a[2] + a[3]) == list(range(6))
    assert a[0] + a[1] != a[2] + a[3]  # each epoch draws its own order
    for m in d.make_iterator(4, epochs=2, seed=3, shuffle=True):
        assert tags(m) == [f"r{int(x)}" for x in xs(m)] and m.meta_info["step"] == 7
    assert [len(m) for m in d.make_iterator(4, epochs=3, drop_last=True)] == [4, 4, 4]
    assert list(moved(sample(0)).make_iterator(2, epochs=2)) == []


def test_group_by_several_keys_and_ungroup(moved):
    d = sample(6)
    d = moved(d.union(DataProto.from_dict(non_tensors={"seat": [i % 2 for i in range(6)]})))
    groups = d.group_by(["agent_id", "seat"])
    assert list(groups) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    rows, positions = groups[(1, 0)]  # agent_id = i % 3 == 1 and seat = i % 2 == 0: row 4
    assert positions.tolist() == [4] and xs(rows) == [4.0] and rows.meta_info["step"] == 7
    assert_same(DataProto.ungroup(groups), d)
    assert list(d.group_by("agent_id")) == [0, 1, 2]  # one key: plain values
    by_tensor = d.group_by(["seat", "x"])  # a 1-D tensor column groups too
    assert len(by_tensor) == 6 and by_tensor[(1, 3.0)][1].tolist() == [3]
    (nan,) = [k for k in d.group_by("score") if k != k]  # NaN rows form one group
    assert d.group_by("score")[nan][1].tolist() == [1, 3, 5]
    with pytest.raises(ValueError, match="no 1-D column 'mat'"):
        d.group_by(["seat", "mat"])
    with pytest.raises(ValueError, match=r"values of \['ids'\] must be hashable"):
        d.group_by("ids")
    assert moved(sample(0)).group_by(["agent_id", "tag"]) == {}


def test_sample_level_repeat_repeats_each_row_its_own_number_of_times(moved):
    d = moved(sample(3))
    r = d.sample_level_repeat([2, 0, 3])
    assert xs(r) == [0, 0, 2, 2, 2] and tags(r) == ["r0", "r0", "r2", "r2", "r2"]
    assert r.non_tensor["ids"].tolist() == [[0], [0], [2], [2], [2]] and r.meta_info["step"] == 7
    assert_same(d.sample_level_repeat(torch.tensor([1, 1, 1])), d)
    assert len(d.sample_level_repeat(np.zeros(3, dtype=np.int64))) == 0
    with pytest.raises(ValueError, match="for a batch of 3 rows"):
        d.sample_level_repeat([1, 1])
    with pytest.raises(ValueError, match="counts must be ints >= 0"):
        d.sample_level_repeat([1, -1, 1])
    assert_same(moved(sample(0)).sample_level_repeat([]), moved(sample(0)))


def test_tensordict_round_trip_keeps_rows_columns_and_meta_info(moved):
    d = moved(sample(4))
    td = d.to_tensordict()
    assert td.batch_size == torch.Size([4]) and torch.equal(td["mat"], d.batch["mat"])
    assert td.get("tag").tolist() == tags(d) and td["step"] == 7
    assert_same(DataProto.from_tensordict(td), d)
    assert_same(DataProto.from_tensordict(td[1:3]), d[1:3])  # rows sliced as a TensorDict stay aligned
    plain = DataProto.from_tensordict(TensorDict({"a": torch.ones(2)}, batch_size=[2]))
    assert len(plain) == 2 and plain.non_tensor == {} and plain.meta_info == {}
    clash = sample(2)
    clash.meta_info["tag"] = 1
    with pytest.raises(ValueError, match="meta_info 'tag' has the name of a column"):
        clash.to_tensordict()
    empty = moved(sample(0))
    assert_same(DataProto.from_tensordict(empty.to_tensordict()), empty)


def test_save_to_disk_and_load_from_disk(moved, tmp_path):
    for n in (4, 0):
        d = moved(sample(n))
        d.save_to_disk(tmp_path / f"b{n}.pkl")
        assert_same(DataProto.load_from_disk(tmp_path / f"b{n}.pkl"), d)
    (tmp_path / "other.pkl").write_bytes(pickle.dumps({"not": "a batch"}))
    with pytest.raises(ValueError, match="holds a dict, not a DataProto"):
        DataProto.load_from_disk(tmp_path / "other.pkl")


def test_check_consistency_names_the_key(moved):
    d = moved(sample(3))
    d.check_consistency()
    d.non_tensor["bad"] = np.array([1, 2], dtype=object)
    with pytest.raises(ValueError, match=r"non_tensor\['bad'\] has 2 rows but the batch has 3"):
        d.check_consistency()
    d.non_tensor["bad"] = np.array([1, 2, 3])
    msg = r"non_tensor\['bad'\] must be a numpy object array of B rows, got an array of int64"
    with pytest.raises(ValueError, match=msg):
        d.check_consistency()
    with pytest.raises(ValueError, match="'x' is both a tensor and a non_tensor column"):
        DataProto(d.batch, {"x": [1, 2, 3]})
    with pytest.raises(ValueError, match="exactly one batch dim"):
        DataProto(TensorDict({}, batch_size=[2, 2]))
    moved(sample(0)).check_consistency()


def test_subclass_and_its_fields_survive_every_operation(moved, tmp_path):
    base = sample(4)
    d = moved(Rollout(base.batch, dict(base.non_tensor), base.meta_info, source="hanabi"))
    groups = d.group_by("agent_id")
    d.save_to_disk(tmp_path / "r.pkl")
    results = [d[1:3], d[np.int64(1)], d[[0, 2]], d.select(["x"]), d.select_idxs(np.array([1, 0, 1, 1]) > 0)]
    results += [d.repeat(2), d.sample_level_repeat([1, 0, 2, 1]), *d.chunk(3), *d.split(3), d.to("cpu")]
    results += [DataProto.concat(d.chunk(2)), d.union(DataProto.from_dict({"y": torch.ones(4)}))]
    results += [d.pad_to_multiple(3)[0], d.unpad(1), groups[1][0], DataProto.ungroup(groups)]
    results += [next(d.make_iterator(2)), d.select().pop(batch_keys=["x"]), d.select().reorder([3, 2, 1, 0])]
    results += [d.select().rename("x", "z"), Rollout.load_from_disk(tmp_path / "r.pkl")]
    for out in results:
        assert type(out) is Rollout and out.source == "hanabi"
    assert type(Rollout.from_tensordict(d.to_tensordict())) is Rollout
    with pytest.raises(ValueError, match="holds a DataProto, not a Rollout"):
        base.save_to_disk(tmp_path / "base.pkl")
        Rollout.load_from_disk(tmp_path / "base.pkl")
