"""Batches for the DataProto tests: a fixed one, random ones, and a comparison that counts NaN == NaN.

``assert_same`` is written with torch.testing and numpy.testing, not with roll_ma's own equality,
so the tests do not check the code with itself.
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict

from roll_ma.protocol import DataProto


def sample(n: int = 6, start: int = 0) -> DataProto:
    """n rows: tensors (one NaN-carrying float column), object columns of every kind, and meta_info."""
    nan = float("nan")
    rows = torch.arange(start, start + n)
    lp = rows.float().neg()
    lp[rows % 3 == 1] = nan  # a log-prob that is NaN on some rows
    return DataProto.from_dict(
        tensors={"x": rows.float(), "mat": rows.view(-1, 1).repeat(1, 3), "lp": lp},
        non_tensors={
            "agent_id": [int(i) % 3 for i in rows],
            "tag": [f"r{int(i)}" for i in rows],
            "ids": [[int(i)] * (int(i) % 2 + 1) for i in rows],  # ragged lists stay one object per row
            "arr": [np.array([float(i), nan]) for i in rows],
            "score": [nan if int(i) % 2 else float(i) for i in rows],
        },
        meta_info={"step": 7, "nested": {"a": 1}, "probs": np.array([0.5, np.nan]), "metrics": {"kl": nan}},
    )


def assert_same(a: DataProto, b: DataProto) -> None:
    """Same type, rows, keys and values (NaN == NaN; tensors also in dtype and shape)."""
    assert type(a) is type(b), (type(a), type(b))
    assert len(a) == len(b)
    assert set(a.batch.keys()) == set(b.batch.keys())
    for key, value in a.batch.items():
        torch.testing.assert_close(value, b.batch[key], rtol=0, atol=0, equal_nan=True, msg=key)
    assert set(a.non_tensor) == set(b.non_tensor)
    for key, column in a.non_tensor.items():
        assert column.dtype == object and column.shape == (len(a),)
        np.testing.assert_equal(column.tolist(), b.non_tensor[key].tolist(), err_msg=key)
    np.testing.assert_equal(a.meta_info, b.meta_info)


_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.int64, torch.int32, torch.bool, torch.uint8]


def _random_tensor(rng: np.random.Generator, n: int) -> torch.Tensor:
    dtype = _DTYPES[int(rng.integers(len(_DTYPES)))]
    shape = (n, *[int(s) for s in rng.integers(1, 4, size=int(rng.integers(0, 3)))])
    values = torch.from_numpy(rng.standard_normal(shape) * 5)
    if dtype.is_floating_point:
        values[torch.from_numpy(rng.random(shape) < 0.25)] = float("nan")
        return values.to(dtype)
    if dtype == torch.bool:
        return values > 0
    return values.abs().to(dtype)


def _random_object(rng: np.random.Generator, kind: int) -> object:
    """One row's value of an object column of the given kind (a column keeps one kind, or mixes: 6)."""
    kind = int(rng.integers(6)) if kind == 6 else kind
    if kind == 0:
        return f"s{int(rng.integers(100))}"
    if kind == 1:
        return int(rng.integers(-5, 5))
    if kind == 2:
        return float("nan") if rng.random() < 0.3 else float(rng.standard_normal())
    if kind == 3:
        return [int(v) for v in rng.integers(0, 9, size=int(rng.integers(0, 4)))]  # ragged
    if kind == 4:
        return np.where(rng.random(2) < 0.3, np.nan, rng.standard_normal(2))
    return {"k": int(rng.integers(3)), "v": [float("nan")] if rng.random() < 0.5 else []}


def _random_meta(rng: np.random.Generator) -> dict:
    choices = [
        lambda: int(rng.integers(100)),
        lambda: float("nan"),
        lambda: f"m{int(rng.integers(10))}",
        lambda: np.array([1.0, np.nan, float(rng.standard_normal())]),
        lambda: {"inner": [1, float("nan")], "arr": np.arange(3)},
        lambda: (1, "two", None),
        lambda: {"loss": float("nan"), "tokens": int(rng.integers(10))},
    ]
    meta = {f"m{i}": choices[int(rng.integers(len(choices)))]() for i in range(int(rng.integers(0, 4)))}
    if rng.random() < 0.5:
        meta["metrics"] = {"loss": float(rng.standard_normal()), "kl": float("nan")}
    return meta


def random_batch(seed: int) -> DataProto:
    """Random keys, dtypes (NaN included), object columns and meta_info; B = seed % 9 (0 included)."""
    rng = np.random.default_rng(seed)
    n = seed % 9
    tensors = {f"t{i}": _random_tensor(rng, n) for i in range(int(rng.integers(0, 4)))}
    columns = {}
    for i in range(int(rng.integers(0, 4))):
        kind = int(rng.integers(7))
        columns[f"o{i}"] = [_random_object(rng, kind) for _ in range(n)]
    return DataProto(TensorDict(tensors, batch_size=[n]), columns, _random_meta(rng))
