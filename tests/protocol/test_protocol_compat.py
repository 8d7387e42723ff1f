"""Operations a verl / ROLL user expects of DataProto: clone, select's shared storage, None parts,
from_single_dict, union of self-containing values, verl's union functions, concat's metrics and
global keys, and the numpy form of a TensorDict."""

import copy
import pickle

import numpy as np
import pytest
import torch
from protocol_helpers import assert_same, sample
from tensordict import TensorDict

from roll_ma.protocol import DataProto
from roll_ma.protocol.io import (
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
)
from roll_ma.protocol.values import ConflictingValuesError, union_numpy_dict, union_tensor_dict, values_equal


# ---------------------------------------------------------------- clone and select
def test_clone_is_equal_and_shares_nothing(moved):
    d = moved(sample(4))
    d.meta_info["shared"] = [1, 2]
    d.non_tensor["pair"] = np.array([d.meta_info["shared"]] * 4 + [None], dtype=object)[:4]
    c = d.clone()
    assert_same(c, d)
    c.batch["x"][0] = 100.0
    c.batch["mat"].add_(1)
    c.non_tensor["tag"][1] = "changed"
    c.non_tensor["ids"][0].append(99)  # a row's own list
    c.meta_info["nested"]["a"] = 2
    c.meta_info["new"] = 1
    assert d.batch["x"][0] == 0.0 and d.batch["mat"][0].tolist() == [0, 0, 0]
    assert d.non_tensor["tag"][1] == "r1" and d.non_tensor["ids"][0] == [0]
    assert d.meta_info["nested"] == {"a": 1} and "new" not in d.meta_info
    # one object in two places of the original is one object in two places of the clone
    assert c.non_tensor["pair"][0] is c.non_tensor["pair"][3] is c.meta_info["shared"]
    assert c.meta_info["shared"] is not d.meta_info["shared"]


def test_select_shares_storage_with_the_original_and_clone_does_not():
    d = sample(4)
    view = d.select(batch_keys=["x"], non_tensor_keys=["tag"])
    view.batch["x"][0] = 7.0
    view.non_tensor["tag"][0] = "edited"
    assert d.batch["x"][0] == 7.0 and d.non_tensor["tag"][0] == "edited"  # documented: shared
    view.meta_info["step"] = 0
    assert d.meta_info["step"] == 7  # meta_info is copied
    copied = d.select(batch_keys=["x"]).clone()
    copied.batch["x"][1] = -5.0
    assert d.batch["x"][1] == 1.0


# ---------------------------------------------------------------- construction as verl and ROLL allow
def test_any_part_may_be_none():
    labels = np.array(["a", "b", "c"], dtype=object)
    assert len(DataProto(batch=None, non_tensor={"labels": labels}, meta_info={"i": 1})) == 3
    empty = DataProto(batch=None, non_tensor=None, meta_info=None)
    assert len(empty) == 0 and empty.non_tensor == {} and empty.meta_info == {}
    assert len(DataProto()) == 0
    assert len(DataProto(TensorDict({}, batch_size=[10]))) == 10
    assert len(pickle.loads(pickle.dumps(DataProto(TensorDict({}, batch_size=[10]))))) == 10


def test_from_single_dict_splits_tensors_from_the_rest_and_keeps_the_subclass():
    class Sub(DataProto):
        pass

    d = Sub.from_single_dict({"x": torch.arange(3), "tag": ["a", "b", "c"]}, meta_info={"m": 1})
    assert (
        type(d) is Sub and list(d.batch.keys()) == ["x"] and d.non_tensor["tag"].tolist() == ["a", "b", "c"]
    )
    assert d.meta_info == {"m": 1}
    with pytest.raises(ValueError, match=r"non_tensor\['tag'\] has 2 rows but batch\['x'\] has 3"):
        DataProto.from_single_dict({"x": torch.arange(3), "tag": ["a", "b"]})


# ---------------------------------------------------------------- union of values that hold themselves
def self_holding() -> np.ndarray:
    arr = np.array([None, "x"], dtype=object)
    arr[0] = arr
    return arr


def test_equality_of_self_containing_values_terminates_and_is_right():
    a, b = self_holding(), self_holding()
    assert values_equal(a, a) and values_equal(a, b)
    other = self_holding()
    other[1] = "y"  # same cycle, a different leaf
    assert not values_equal(a, other)
    assert not values_equal(a, np.array([None, "x"], dtype=object))  # a cycle vs no cycle
    loop_a, loop_b = {"k": 1}, {"k": 1}
    loop_a["self"], loop_b["self"] = loop_a, loop_b
    assert values_equal(loop_a, loop_b)
    loop_b["k"] = 2
    assert not values_equal(loop_a, loop_b)
    nested_a, nested_b = [1.0, float("nan")], [1.0, float("nan")]
    nested_a.append(nested_a)
    nested_b.append(nested_b)
    assert values_equal(nested_a, nested_b)  # NaN == NaN inside a cycle too


def test_union_of_batches_with_self_containing_rows():
    left = DataProto.from_dict({"x": torch.arange(2)}, {"cyc": [self_holding(), "plain"]})
    right = DataProto.from_dict({"y": torch.ones(2)}, {"cyc": [self_holding(), "plain"]})
    both = left.union(right)
    assert list(both.batch.keys()) == ["x", "y"] and both.non_tensor["cyc"][0] is left.non_tensor["cyc"][0]
    different = DataProto.from_dict({"y": torch.ones(2)}, {"cyc": [self_holding(), "other"]})
    with pytest.raises(ValueError, match="union: non_tensor 'cyc' is in both batches with different values"):
        left.union(different)


# ---------------------------------------------------------------- verl's module functions
def test_union_tensor_dict_adds_in_place_and_refuses_different_values():
    obs = torch.tensor([[1.0, float("nan")], [3.0, 4.0]])
    td1 = TensorDict({"obs": obs}, batch_size=[2])
    td2 = TensorDict({"obs": obs.clone(), "rew": torch.ones(2)}, batch_size=[2])
    out = union_tensor_dict(td1, td2)
    assert out is td1 and set(td1.keys()) == {"obs", "rew"}  # in place, like verl
    changed = TensorDict({"rew": torch.zeros(2)}, batch_size=[2])
    with pytest.raises(
        ConflictingValuesError, match="union_tensor_dict: 'rew' differs between the two"
    ) as err:
        union_tensor_dict(td1, changed)
    assert isinstance(err.value, ValueError) and isinstance(err.value, AssertionError)
    with pytest.raises(ValueError, match=r"batch sizes differ: \[2\] vs \[3\]"):
        union_tensor_dict(td1, TensorDict({}, batch_size=[3]))


def test_union_numpy_dict_compares_deeply_and_adds_in_place():
    d1 = {"nan": np.array([1.0, np.nan]), "obj": np.array([[np.arange(2), "t"], [None, 1]], dtype=object)}
    d2 = {"nan": np.array([1.0, np.nan]), "obj": copy.deepcopy(d1["obj"]), "cyc": self_holding()}
    out = union_numpy_dict(d1, d2)
    assert out is d1 and set(d1) == {"nan", "obj", "cyc"}
    assert union_numpy_dict({"cyc": self_holding()}, {"cyc": self_holding()})["cyc"][1] == "x"
    msg = r"`nan` in tensor_dict1 and tensor_dict2 are not the same object. \(union_numpy_dict: their values"
    with pytest.raises(ConflictingValuesError, match=msg):
        union_numpy_dict(d1, {"nan": np.array([np.nan, 1.0])})  # NaN moved
    with pytest.raises(ConflictingValuesError, match="`cyc`"):
        union_numpy_dict(d1, {"cyc": np.array([None, "x"], dtype=object)})
    with pytest.raises(ValueError, match=r"tensor_dict2\['nan'\] is a list, not an array"):
        union_numpy_dict(d1, {"nan": [1.0, np.nan]})


# ---------------------------------------------------------------- concat: metrics reports and global keys
def part(rows: int, **meta) -> DataProto:
    return DataProto.from_dict({"x": torch.zeros(rows)}, meta_info=meta)


def test_concat_gathers_lists_of_reports_and_array_values():
    merged = DataProto.concat(
        [
            part(1, metrics=[{"loss": 0.5, "acc": 1.0}, {"loss": 0.7}], flag=True),  # two reports (verl)
            part(2, flag=True),
            part(1, metrics={"loss": np.array([0.1, 0.2]), "acc": 1.0}, flag=True),  # one per micro-batch
        ]
    )
    assert merged.meta_info["metrics"] == {"loss": [0.5, 0.7, 0.1, 0.2], "acc": 1.0}  # acc agrees: once
    assert merged.meta_info["flag"] is True and len(merged) == 4


def test_concat_global_keys_are_gathered_even_when_equal():
    parts = [
        part(2, metrics={"acc": 0.8, "loss": np.array([0.1, 0.2]), "tokens": 10}, lr=1e-4, seed=1),
        part(1, metrics={"loss": np.array([0.15]), "tokens": 10}, lr=1e-4, seed=1),
        part(2, metrics={"acc": 0.9, "precision": np.array([0.7, 0.75])}, seed=2),
    ]
    merged = DataProto.concat(parts, global_keys={"metrics", "lr"})
    assert merged.meta_info["metrics"] == {
        "acc": [0.8, 0.9],
        "loss": [0.1, 0.2, 0.15],
        "tokens": [10, 10],  # equal reports kept apart, so a sum counts both
        "precision": [0.7, 0.75],
    }
    assert merged.meta_info["lr"] == [1e-4, 1e-4, None]  # one entry per part, None where absent
    assert merged.meta_info["seed"] == [1, 1, 2]  # not global: differing values, one per part
    default = DataProto.concat(parts)
    assert default.meta_info["metrics"]["tokens"] == 10 and default.meta_info["lr"] == 1e-4


# ---------------------------------------------------------------- TensorDict as numpy buffers
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
def test_serialized_tensordict_round_trips_every_dtype_bit_exact():
    tensors = {
        "f32": torch.tensor([[1.0, float("nan")], [2.0, 3.0]]),
        "bf16": torch.randn(2, 3).bfloat16(),
        "i64": torch.arange(2),
        "flag": torch.tensor([True, False]),
        "empty": torch.zeros(2, 0),
        "t": torch.arange(6.0).view(3, 2).t(),  # not contiguous
    }
    if hasattr(torch, "float8_e4m3fn"):
        tensors["fp8"] = torch.randn(2, 2).to(torch.float8_e4m3fn)
    td = TensorDict(tensors, batch_size=[2])
    size, device, items = serialize_tensordict(td)
    assert size == (2,) and device is None and items["i64"][0] == "int64" and items["i64"][1] == (2,)
    assert all(isinstance(v[2], np.ndarray) and v[2].dtype == np.uint8 for v in items.values())
    back = deserialize_tensordict(pickle.loads(pickle.dumps((size, device, items))))
    for key, value in tensors.items():
        assert back[key].dtype == value.dtype and back[key].shape == value.shape
        assert torch.equal(back[key].view(torch.uint8), value.contiguous().view(torch.uint8)), key
    nested = torch.nested.as_nested_tensor([torch.randn(2, 3), torch.randn(1, 3)])
    back = deserialize_tensordict(serialize_tensordict(TensorDict({"n": nested}, batch_size=[2])))
    assert all(torch.equal(a, b) for a, b in zip(back["n"].unbind(), nested.unbind()))
    assert torch.equal(
        deserialize_single_tensor(serialize_single_tensor(torch.tensor(2.5))), torch.tensor(2.5)
    )


def test_deserialize_names_what_is_wrong():
    with pytest.raises(ValueError, match="'complex_banana' is not a torch dtype"):
        deserialize_single_tensor(("complex_banana", (1,), b"\x00"))
    with pytest.raises(ValueError, match="'x' has 1 fields, expected 3"):
        deserialize_tensordict(((1,), None, {"x": ("int64",)}))
    with pytest.raises(ValueError, match="'sub' holds a TensorDict, not a tensor"):
        serialize_tensordict(TensorDict({"sub": TensorDict({}, batch_size=[1])}, batch_size=[1]))
