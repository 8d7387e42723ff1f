"""What callers pass to DataProto operations, checked and normalised (a ValueError names the key).

One job: turn row indices, masks, repeat counts, key lists, per-row columns and group_by columns
into plain numpy positions and lists, so that the operations in ``roll_ma.protocol`` stay short.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, cast

import numpy as np
import torch
from tensordict import TensorDict

Keys = str | Sequence[str] | None

_NAN = float("nan")  # one NaN object: dict lookups match it by identity, so NaN values form one group


def tensor_columns(batch: TensorDict) -> dict[str, torch.Tensor]:
    """A DataProto's tensors by name, as a new dict.

    The cast: a DataProto's batch is flat, str keys and tensor values; the tensordict stubs type its
    items as (NestedKey, Tensor | TensorCollection).
    """
    return cast(dict[str, torch.Tensor], dict(batch.items()))


def object_column(values: Any, key: str) -> np.ndarray:
    """(B,) object array, one object per row even when rows are lists (np.array would make it 2-D).

    An object array is kept as it is (its first dim counts the rows): fold_batch_dim makes (B', k) ones.
    """
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim >= 1:
        return values
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ValueError(f"non_tensor[{key!r}] must be a sequence with one value per row, got {type(values)}")
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def row_positions(idxs: Any, length: int) -> np.ndarray:
    """(N,) int64 positions from one row (int, np.int64, 0-d tensor), an index array or a (B,) bool mask."""
    if isinstance(idxs, torch.Tensor):
        idxs = idxs.cpu().numpy()
    idxs = np.asarray(idxs)
    if idxs.dtype == bool:
        if idxs.shape != (length,):
            raise ValueError(f"bool mask has shape {idxs.shape} but the batch has {length} rows")
        return np.nonzero(idxs)[0].astype(np.int64)
    if idxs.size == 0:
        return np.zeros(0, dtype=np.int64)
    if idxs.ndim == 0:  # one row, like an int
        idxs = idxs.reshape(1)
    if idxs.ndim != 1 or not np.issubdtype(idxs.dtype, np.integer):
        raise ValueError(f"row indices must be a 1-D int array or a bool mask, got {idxs.dtype} {idxs.shape}")
    if idxs.min() < -length or idxs.max() >= length:
        raise ValueError(f"row index out of range for a batch of {length} rows")
    return idxs.astype(np.int64)


def permutation(indices: Any, length: int) -> np.ndarray:
    """(B,) positions that must visit every row exactly once (negative indices count from the end)."""
    positions = row_positions(indices, length) % max(length, 1)
    if not np.array_equal(np.sort(positions), np.arange(length)):
        raise ValueError(f"reorder needs a permutation of 0..{length - 1}; use select_idxs to select rows")
    return positions


def repeat_positions(counts: Any, length: int) -> np.ndarray:
    """(sum(counts),) positions: row i counts[i] times in a row."""
    if isinstance(counts, torch.Tensor):
        counts = counts.cpu().numpy()
    counts = np.asarray(counts)
    if counts.shape != (length,):
        raise ValueError(f"sample_level_repeat: {counts.shape} counts for a batch of {length} rows")
    if counts.size and (not np.issubdtype(counts.dtype, np.integer) or counts.min() < 0):
        raise ValueError(f"sample_level_repeat: counts must be ints >= 0, got {counts.tolist()}")
    return np.repeat(np.arange(length), counts.astype(np.int64))


def split_sizes(size: int | Sequence[int], length: int) -> list[int]:
    """Piece sizes: ``size`` rows each (the last may be smaller; [0] when empty), or the listed sizes."""
    if isinstance(size, (int, np.integer)):
        if size <= 0:
            raise ValueError(f"split size must be >= 1, got {size}")
        sizes = [min(int(size), length - start) for start in range(0, length, int(size))] or [0]
    else:
        sizes = [int(s) for s in size]
    if sum(sizes) != length or any(s < 0 for s in sizes):
        raise ValueError(f"split sizes {sizes} add up to {sum(sizes)} but the batch has {length} rows")
    return sizes


def common_length(tensors: dict[str, Any], non_tensors: dict[str, Any]) -> int:
    """B of from_dict's inputs: every tensor and column must have the same number of rows (0 if none)."""
    lengths = {f"batch[{k!r}]": int(v.shape[0]) for k, v in tensors.items()}
    lengths.update({f"non_tensor[{k!r}]": len(v) for k, v in non_tensors.items()})
    if len(set(lengths.values())) > 1:
        (k0, n0), *rest = lengths.items()
        k1, n1 = next((k, n) for k, n in rest if n != n0)
        raise ValueError(f"{k1} has {n1} rows but {k0} has {n0}")
    return next(iter(lengths.values()), 0)


def key_list(keys: Keys) -> list[str]:
    """One key or several, as a list (None: none)."""
    return [keys] if isinstance(keys, str) else list(keys or [])


def group_columns(data: Any, names: list[str]) -> dict[str, list[Any]]:
    """group_by's columns as lists: non-tensor columns or 1-D tensors of ``data``, by name."""
    if not names:
        raise ValueError("group_by needs at least one key")
    columns = {}
    for key in names:
        if key in data.non_tensor:
            columns[key] = data.non_tensor[key].tolist()
        elif key in data.batch.keys() and data.batch[key].ndim == 1:
            columns[key] = data.batch[key].tolist()
        else:
            raise ValueError(f"group_by: no 1-D column {key!r}; columns are {data.keys}")
    return columns


def minibatch_positions(
    length: int, mini_batch_size: int, epochs: int, seed: int | None, shuffle: bool, drop_last: bool
) -> Iterator[np.ndarray]:
    """make_iterator's row positions: per epoch, pieces of mini_batch_size (the last may be smaller).

    With shuffle, each epoch takes a new order from one generator seeded once with ``seed``.
    """
    if mini_batch_size <= 0:
        raise ValueError(f"mini_batch_size must be >= 1, got {mini_batch_size}")
    if epochs < 0:
        raise ValueError(f"epochs must be >= 0, got {epochs}")
    rng = np.random.default_rng(seed)
    stop = length - (length % mini_batch_size if drop_last else 0)
    for _ in range(epochs):
        order = rng.permutation(length) if shuffle else np.arange(length)
        for start in range(0, stop, mini_batch_size):
            yield order[start : start + mini_batch_size]


def group_positions(columns: dict[str, list[Any]], as_tuples: bool) -> dict[Any, np.ndarray]:
    """{value: its rows' positions} over the rows of ``columns`` (B values each), values in sorted order.

    With ``as_tuples`` a value is the tuple of the columns' values in that row; NaN is one value.
    """
    rows = zip(*[[_NAN if isinstance(v, float) and v != v else v for v in col] for col in columns.values()])
    groups: dict[Any, list[int]] = {}
    for i, row in enumerate(rows):
        value = row if as_tuples else row[0]
        try:
            groups.setdefault(value, []).append(i)
        except TypeError:
            raise ValueError(f"group_by: values of {list(columns)} must be hashable, got {value!r}") from None

    def order(value: Any) -> list[tuple[str, Any]]:  # values of mixed types sort by type name first
        return [(type(v).__name__, v) for v in (value if as_tuples else (value,))]

    return {v: np.asarray(groups[v], dtype=np.int64) for v in sorted(groups, key=order)}


def check_same_columns(parts: Sequence[Any]) -> None:
    """concat's precondition: every part has part 0's tensor and non-tensor keys and row shapes."""
    first = parts[0]
    batch_keys, nt_keys = set(first.batch.keys()), set(first.non_tensor)
    for i, part in enumerate(parts[1:], start=1):
        for key in batch_keys ^ set(part.batch.keys()):
            where = "part 0" if key in batch_keys else f"part {i}"
            raise ValueError(f"concat: tensor {key!r} is in {where} only (parts 0 and {i} differ)")
        for key in nt_keys ^ set(part.non_tensor):
            where = "part 0" if key in nt_keys else f"part {i}"
            raise ValueError(f"concat: non_tensor {key!r} is in {where} only (parts 0 and {i} differ)")
        shapes = [(f"tensor {k!r}", first.batch[k].shape, part.batch[k].shape) for k in batch_keys]
        columns = [(k, first.non_tensor[k].shape, part.non_tensor[k].shape) for k in nt_keys]
        shapes += [(f"non_tensor {k!r}", a, b) for k, a, b in columns]
        for what, a, b in shapes:
            if a[1:] != b[1:]:
                raise ValueError(
                    f"concat: {what} has row shape {tuple(a[1:])} in part 0 but {tuple(b[1:])} in part {i}"
                )


def check_keys(data: Any, op: str, batch_keys: list[str], nt_keys: list[str], meta_keys: list[str]) -> None:
    """Every named key must exist in its part of ``data``."""
    for key in batch_keys:
        if key not in data.batch.keys():
            raise ValueError(f"{op}: no tensor {key!r}; tensors are {list(data.batch.keys())}")
    for key in nt_keys:
        if key not in data.non_tensor:
            raise ValueError(f"{op}: no non_tensor {key!r}; non_tensors are {list(data.non_tensor)}")
    for key in meta_keys:
        if key not in data.meta_info:
            raise ValueError(f"{op}: no meta_info {key!r}; meta_info keys are {list(data.meta_info)}")


def ungroup_order(groups: Sequence[tuple[int, Any]]) -> np.ndarray:
    """(B,) positions that put the concatenated groups' rows back in order; groups: (rows, positions)."""
    if not groups:
        raise ValueError("ungroup needs at least one group")
    for i, (rows, idx) in enumerate(groups):
        if rows != len(idx):
            raise ValueError(f"ungroup: group {i} has {rows} rows but {len(idx)} positions")
    positions = np.concatenate([np.asarray(idx, dtype=np.int64) for _, idx in groups])
    total = len(positions)
    if not np.array_equal(np.sort(positions), np.arange(total)):
        raise ValueError(f"ungroup: positions must cover 0..{total - 1} exactly once")
    inverse = np.empty(total, dtype=np.int64)
    inverse[positions] = np.arange(total)
    return inverse
