"""DataProto: every operation keeps rows aligned across tensors, non-tensors and meta_info."""

import pickle

import numpy as np
import pytest
import torch
from protocol_helpers import assert_same, sample

from roll_ma.protocol import DataProto


def make(n: int = 6, start: int = 0) -> DataProto:
    rows = torch.arange(start, start + n)
    return DataProto.from_dict(
        tensors={"x": rows.float(), "mat": rows.view(-1, 1).repeat(1, 3)},
        non_tensors={
            "agent_id": [int(i) % 3 for i in rows],
            "tag": [f"r{int(i)}" for i in rows],
            "ids": [[int(i)] * (int(i) % 2 + 1) for i in rows],
        },  # ragged lists stay one object per row
        meta_info={"step": 7, "nested": {"a": 1}},
    )


def test_from_dict_and_len():
    d = make(4)
    assert len(d) == 4
    assert d.non_tensor["ids"].dtype == object and d.non_tensor["ids"].shape == (4,)
    assert d.non_tensor["ids"][1] == [1, 1]


def test_mismatched_lengths_name_the_key_and_sizes():
    with pytest.raises(ValueError, match=r"non_tensor\['b'\] has 2 rows but batch\['a'\] has 3"):
        DataProto.from_dict({"a": torch.zeros(3)}, {"b": [1, 2]})
    d = make(3)
    with pytest.raises(ValueError, match=r"non_tensor\['bad'\] has 2 rows but the batch has 3"):
        DataProto(d.batch, {"bad": np.array([1, 2], dtype=object)})


def test_concat_and_key_mismatch():
    a, b = make(3), make(2, start=3)
    c = DataProto.concat([a, b])
    assert c.batch["x"].tolist() == [0, 1, 2, 3, 4]
    assert c.non_tensor["tag"].tolist() == ["r0", "r1", "r2", "r3", "r4"]
    assert c.meta_info == a.meta_info and c.meta_info is not a.meta_info
    with pytest.raises(ValueError, match="tensor 'x' is in part 0 only"):
        DataProto.concat([a, b.select(batch_keys=["mat"])])
    with pytest.raises(ValueError, match="non_tensor 'tag'"):
        DataProto.concat([a, b.select(non_tensor_keys=["agent_id", "ids"])])


def test_chunk_gives_each_piece_its_own_meta_info():
    parts = make(7).chunk(3)
    assert [len(p) for p in parts] == [3, 2, 2]
    parts[0].meta_info["nested"]["a"] = 99
    assert parts[1].meta_info["nested"]["a"] == 1
    assert torch.equal(DataProto.concat(parts).batch["x"], make(7).batch["x"])


def test_split_sizes():
    parts = make(6).split([1, 0, 5])
    assert [len(p) for p in parts] == [1, 0, 5]
    assert parts[2].non_tensor["tag"][0] == "r1"
    with pytest.raises(ValueError, match="add up to 5 but the batch has 6"):
        make(6).split([2, 3])


def test_select_keys_and_idxs():
    d = make(6)
    s = d.select(batch_keys=["x"], non_tensor_keys=["tag"], meta_info_keys=["step"])
    assert list(s.batch.keys()) == ["x"] and list(s.non_tensor) == ["tag"] and s.meta_info == {"step": 7}
    with pytest.raises(ValueError, match="no tensor 'nope'"):
        d.select(batch_keys=["nope"])
    by_index = d.select_idxs(np.array([4, 1]))
    assert by_index.batch["x"].tolist() == [4, 1] and by_index.non_tensor["tag"].tolist() == ["r4", "r1"]
    mask = np.array([True, False, False, True, False, True])
    assert d.select_idxs(mask).batch["x"].tolist() == [0, 3, 5]
    with pytest.raises(ValueError, match="bool mask has shape"):
        d.select_idxs(np.array([True, False]))
    assert d[1:3].batch["x"].tolist() == [1, 2]


def test_union():
    d = make(4)
    extra = DataProto.from_dict({"y": torch.ones(4)}, {"z": list("abcd")}, {"k": 1})
    u = d.union(extra)
    assert set(u.batch.keys()) == {"x", "mat", "y"} and u.non_tensor["z"].tolist() == list("abcd")
    assert u.meta_info["k"] == 1 and u.meta_info["step"] == 7
    with pytest.raises(ValueError, match="this batch has 4 rows but the other has 2"):
        d.union(make(2))
    clash = DataProto.from_dict({"x": torch.zeros(4)})
    with pytest.raises(ValueError, match="tensor 'x' is in both batches with different values"):
        d.union(clash)


def test_repeat_interleave_and_tile():
    d = make(2)
    assert d.repeat(2, interleave=True).batch["x"].tolist() == [0, 0, 1, 1]
    assert d.repeat(2, interleave=False).non_tensor["tag"].tolist() == ["r0", "r1", "r0", "r1"]


def test_group_by_and_ungroup_round_trip():
    d = make(7)
    groups = d.group_by("agent_id")
    assert list(groups) == [0, 1, 2]
    sub, idx = groups[1]
    assert idx.tolist() == [1, 4] and sub.batch["x"].tolist() == [1, 4]
    # process each group (as a per-agent update would), then scatter back to the original order
    processed = {
        k: (g.union(DataProto.from_dict({"out": g.batch["x"] * 10})), i) for k, (g, i) in groups.items()
    }
    back = DataProto.ungroup(processed)
    assert back.batch["out"].tolist() == [x * 10 for x in range(7)]
    assert back.non_tensor["tag"].tolist() == d.non_tensor["tag"].tolist()
    with pytest.raises(ValueError, match="positions must cover"):
        DataProto.ungroup([(sub, np.array([0, 0]))])


def test_pad_to_multiple_and_unpad():
    d = make(5)
    padded, pad = d.pad_to_multiple(4)
    assert len(padded) == 8 and pad == 3
    assert padded.batch["x"].tolist()[-3:] == [0, 1, 2]
    assert torch.equal(padded.unpad(pad).batch["x"], d.batch["x"])
    same, zero = make(4).pad_to_multiple(2)
    assert zero == 0 and len(same) == 4


def test_minibatches_cover_every_row_once_and_shuffle_is_seeded():
    d = make(10)
    plain = [m.batch["x"].tolist() for m in d.iter_minibatches(4)]
    assert plain == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    a = [m.batch["x"].tolist() for m in d.iter_minibatches(4, shuffle=True, seed=3)]
    b = [m.batch["x"].tolist() for m in d.iter_minibatches(4, shuffle=True, seed=3)]
    assert a == b and sorted(sum(a, [])) == list(range(10)) and a != plain
    assert [len(m) for m in d.iter_minibatches(4, drop_last=True)] == [4, 4]


def test_to_device_and_pickle():
    d = make(3).to("cpu")
    back = pickle.loads(pickle.dumps(d))
    assert torch.equal(back.batch["mat"], d.batch["mat"])
    assert back.non_tensor["ids"].tolist() == d.non_tensor["ids"].tolist() and back.meta_info == d.meta_info


def test_empty_batch_operations():
    e = DataProto.empty({"k": 1})
    assert len(e) == 0 and e.chunk(2)[0].meta_info == {"k": 1}
    assert len(make(2).select_idxs(np.array([], dtype=np.int64))) == 0


# ---------------------------------------------------------------- regressions of issue 20


def test_union_with_equal_object_columns_and_numpy_meta_info(moved):
    """Bug 1: equal numpy object columns / numpy arrays in meta_info raised 'truth value ambiguous'."""
    d = moved(sample(4))
    twin = sample(4).select(non_tensor_keys=["arr", "ids"])  # rows hold numpy arrays and lists
    merged = d.union(twin)
    assert_same(merged, d)
    with pytest.raises(ValueError, match="non_tensor 'arr' is in both batches with different values"):
        d.union(sample(4, start=1).select(batch_keys=[], non_tensor_keys=["arr"], meta_info_keys=[]))
    other = sample(4).select(batch_keys=[], non_tensor_keys=[], meta_info_keys=[])
    other.meta_info["probs"] = np.array([0.5, 0.25])
    with pytest.raises(ValueError, match="meta_info 'probs' differs"):
        d.union(other)


def test_union_counts_nan_as_equal_to_nan(moved):
    """Bug 2: a batch with NaN log-probs, scores and metrics unions with its own round-tripped copy."""
    d = sample(5)
    assert torch.isnan(d.batch["lp"]).any() and np.isnan(d.meta_info["metrics"]["kl"])
    assert_same(d.union(moved(d)), d)
    changed = moved(d).select()
    changed.batch["lp"] = torch.nan_to_num(changed.batch["lp"])  # the NaNs became numbers
    with pytest.raises(ValueError, match="tensor 'lp' is in both batches with different values"):
        d.union(changed)
    changed = moved(d).select()
    changed.non_tensor["score"] = changed.non_tensor["score"].copy()
    changed.non_tensor["score"][1] = 1.0
    with pytest.raises(ValueError, match="non_tensor 'score'"):
        d.union(changed)
    other = d.select(batch_keys=[], non_tensor_keys=[], meta_info_keys=[])
    other.meta_info["metrics"] = {"kl": 0.0}
    with pytest.raises(ValueError, match="meta_info 'metrics' differs"):
        d.union(other)


def test_index_with_numpy_int_and_0d_tensor():
    """Bug 3: np.int64 and 0-d tensors index one row, like int."""
    d = make(4)
    assert d[np.int64(2)].batch["x"].tolist() == [2.0]
    assert d[torch.tensor(-1)].non_tensor["tag"].tolist() == ["r3"]


def test_concat_merges_meta_info_and_drops_nothing():
    """Bug 4: ranks >= 1 lost their meta_info. Equal keys once, differing keys one entry per part."""
    shared = {"step": 3, "probs": np.array([np.nan])}
    a = DataProto.from_dict(
        {"x": torch.zeros(2)}, meta_info={**shared, "episodes": ["e0"], "metrics": {"loss": 1.0, "lr": 0.1}}
    )
    b_metrics = {"loss": 2.0, "lr": 0.1, "kl": 0.5}
    b = DataProto.from_dict(
        {"x": torch.ones(1)}, meta_info={**shared, "episodes": ["e1", "e2"], "rank": 1, "metrics": b_metrics}
    )
    c = DataProto.concat([a, b])
    assert c.meta_info["step"] == 3 and c.meta_info["rank"] == 1  # the parts that carry it agree: once
    np.testing.assert_equal(c.meta_info["probs"], np.array([np.nan]))  # NaN == NaN: once
    assert c.meta_info["episodes"] == [["e0"], ["e1", "e2"]]  # differing: one entry per part
    assert c.meta_info["metrics"] == {"loss": [1.0, 2.0], "lr": 0.1, "kl": 0.5}  # name by name
    assert np.mean(c.meta_info["metrics"]["loss"]) == 1.5 and np.mean(c.meta_info["metrics"]["lr"]) == 0.1
    three = DataProto.concat([DataProto.empty({"k": 1}), DataProto.empty(), DataProto.empty({"k": 2})])
    assert three.meta_info == {"k": [1, None, 2]}  # None marks the part without the key
    c.meta_info["episodes"][0].append("changed")
    assert a.meta_info["episodes"] == ["e0"]  # the merge copies


def test_concat_padded_merges_the_meta_info_of_empty_parts_too():
    from roll_ma.packing import concat_padded, pack_sequences

    def part(prompts, responses, episodes):
        tensors = pack_sequences(prompts, responses, pad_id=0)
        return DataProto.from_dict(tensors, meta_info={"pad_id": 0, "episodes": episodes})

    empty = DataProto.empty({"pad_id": 0, "episodes": []})  # an env worker that played no model turn
    out = concat_padded([part([[5]], [[6, 7]], ["a"]), empty, part([[5, 5]], [[6]], ["b"])])
    assert out.batch["prompts"].tolist() == [[0, 5], [5, 5]]
    assert out.batch["responses"].tolist() == [[6, 7], [6, 0]]
    assert out.meta_info == {"pad_id": 0, "episodes": [["a"], [], ["b"]]}
