"""fold_batch_dim / unfold_batch_dim / unfold_column_chunks: values, shapes, meta_info and the errors."""

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from protocol_helpers import assert_same, sample

from roll_ma.protocol import DataProto


@dataclass
class Rollout(DataProto):
    source: str = "env"


def six_rows() -> DataProto:
    return DataProto.from_dict(
        tensors={"obs": torch.arange(12).view(6, 2), "score": torch.arange(6.0)},
        non_tensors={"tag": list("abcdef"), "ids": [[i] * (i % 2 + 1) for i in range(6)]},
        meta_info={"step": 3, "nested": {"k": [1]}},
    )


def test_fold_groups_consecutive_rows_in_every_column():
    d = six_rows()
    folded = d.fold_batch_dim(3)
    assert len(folded) == 3 and folded.batch.batch_size == torch.Size([3])
    assert folded.batch["obs"].tolist() == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9], [10, 11]]]
    assert folded.batch["score"].tolist() == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    assert folded.non_tensor["tag"].shape == (3, 2)
    assert folded.non_tensor["tag"].tolist() == [["a", "b"], ["c", "d"], ["e", "f"]]
    assert folded.non_tensor["ids"][2, 1] == [5, 5]  # a row's list stays one object
    assert folded.meta_info == d.meta_info and folded.meta_info is not d.meta_info
    assert d.fold_batch_dim(1).batch["score"].shape == (1, 6)
    assert d.fold_batch_dim(6).non_tensor["tag"].tolist() == [[t] for t in "abcdef"]


def test_fold_then_unfold_gives_the_batch_back_and_follows_row_operations():
    d = sample(6)
    assert_same(d.fold_batch_dim(2).unfold_batch_dim(2), d)
    assert_same(d.fold_batch_dim(3).unfold_batch_dim(), d)
    assert_same(d.unfold_batch_dim(1), d)  # one leading dim: nothing to merge
    # folded rows move as groups: reorder the 3 groups, unfold, and each group's rows stay together
    moved = six_rows().fold_batch_dim(3).reorder([1, 2, 0]).unfold_batch_dim(2)
    assert moved.batch["obs"][:, 0].tolist() == [4, 6, 8, 10, 0, 2]
    assert moved.non_tensor["tag"].tolist() == list("cdefab")
    assert moved.non_tensor["ids"].tolist() == [[2], [3, 3], [4], [5, 5], [0], [1, 1]]
    assert moved.meta_info == {"step": 3, "nested": {"k": [1]}}
    # folded batches concat along the groups and survive a pickle like any batch
    twice = DataProto.concat([six_rows().fold_batch_dim(3), six_rows().fold_batch_dim(3)])
    assert twice.unfold_batch_dim().non_tensor["tag"].tolist() == list("abcdef") * 2


def test_fold_and_unfold_are_views_of_the_original():
    d = six_rows()
    folded = d.fold_batch_dim(2)
    folded.batch["score"][0, 0] = 100.0
    folded.non_tensor["tag"][1, 0] = "Z"
    assert d.batch["score"][0] == 100.0 and d.non_tensor["tag"][3] == "Z"
    independent = d.fold_batch_dim(2).clone()
    independent.batch["score"][0, 0] = -1.0
    assert d.batch["score"][0] == 100.0


def test_fold_and_unfold_name_what_does_not_fit():
    d = six_rows()
    with pytest.raises(
        ValueError, match=r"fold_batch_dim: 6 rows cannot fold into 4 rows \(need >= 1, dividing B\)"
    ):
        d.fold_batch_dim(4)
    with pytest.raises(ValueError, match="cannot fold into 0 rows"):
        d.fold_batch_dim(0)
    with pytest.raises(
        ValueError, match=r"unfold_batch_dim: tensor 'score' has shape \(6,\), fewer than batch_dims=2"
    ):
        d.unfold_batch_dim(2)
    bad = d.fold_batch_dim(3)
    bad.non_tensor["tag"] = np.empty((3, 3), dtype=object)  # a column folded another way
    with pytest.raises(
        ValueError, match=r"non_tensor 'tag' has leading dims \(3, 3\) but tensor 'obs' has \(3, 2\)"
    ):
        bad.unfold_batch_dim(2)
    with pytest.raises(ValueError, match="no column to read the folded dims from"):
        DataProto.from_dict(meta_info={"a": 1}).unfold_batch_dim(2)
    with pytest.raises(ValueError, match="batch_dims >= 1"):
        d.unfold_batch_dim(0)


def test_unfold_column_chunks_splits_dim1_of_split_keys_and_repeats_the_rest():
    d = DataProto.from_dict(
        tensors={"obs": torch.arange(12).view(3, 4), "cond": torch.tensor([[1, 2], [5, 6], [9, 10]])},
        non_tensors={"tag": ["a", "b", "c"], "words": [["a1", "a2"], ("b1", "b2"), np.array(["c1", "c2"])]},
        meta_info={"name": "abc"},
    )
    out = d.unfold_column_chunks(2, split_keys=["obs", "words"])
    assert out.batch["obs"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]
    assert out.batch["cond"].tolist() == [[1, 2], [1, 2], [5, 6], [5, 6], [9, 10], [9, 10]]
    assert out.non_tensor["tag"].tolist() == ["a", "a", "b", "b", "c", "c"]
    words = out.non_tensor["words"]
    assert words.shape == (6,) and [list(w) for w in words] == [
        ["a1"],
        ["a2"],
        ["b1"],
        ["b2"],
        ["c1"],
        ["c2"],
    ]
    assert type(words[0]) is list and type(words[2]) is tuple  # each row keeps its sequence type
    assert out.meta_info == {"name": "abc"}
    # dims after the split one are carried along
    cube = DataProto.from_dict({"x": torch.arange(24).view(2, 4, 3)})
    assert cube.unfold_column_chunks(4, "x").batch["x"].shape == (8, 1, 3)
    assert torch.equal(cube.unfold_column_chunks(4, "x").batch["x"].reshape(2, 4, 3), cube.batch["x"])
    # a 2-D object column (a folded one) splits like a tensor
    folded = six_rows().fold_batch_dim(3)
    assert folded.unfold_column_chunks(2, "tag").non_tensor["tag"].tolist() == [[t] for t in "abcdef"]
    # no split keys: every row repeated
    assert_same(d.unfold_column_chunks(3), d.repeat(3))


def test_unfold_column_chunks_names_what_does_not_split():
    d = DataProto.from_dict(
        {"obs": torch.zeros(2, 3), "flat": torch.zeros(2)}, {"words": [["a", "b"], ["c"]]}
    )
    with pytest.raises(ValueError, match=r"'obs' has shape \(2, 3\); dim 1 must split into 2 equal chunks"):
        d.unfold_column_chunks(2, ["obs"])
    with pytest.raises(ValueError, match=r"'flat' has shape \(2,\); dim 1 must split into 2"):
        d.unfold_column_chunks(2, ["flat"])
    with pytest.raises(ValueError, match=r"a row of non_tensor 'words' holds \['c'\]; it must be a sequence"):
        d.unfold_column_chunks(2, ["words"])
    with pytest.raises(ValueError, match=r"no column 'nope'; columns are \['obs', 'flat', 'words'\]"):
        d.unfold_column_chunks(2, ["nope"])
    with pytest.raises(ValueError, match="n_split >= 1"):
        d.unfold_column_chunks(0)


def test_reshapes_keep_the_subclass_and_its_fields():
    base = six_rows()
    d = Rollout(base.batch, dict(base.non_tensor), base.meta_info, source="hanabi")
    for out in (
        d.fold_batch_dim(2),
        d.fold_batch_dim(2).unfold_batch_dim(),
        d.unfold_column_chunks(2),
        d.clone(),
    ):
        assert type(out) is Rollout and out.source == "hanabi"
