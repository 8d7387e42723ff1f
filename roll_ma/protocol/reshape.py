"""Reshaping a DataProto's rows: fold B rows into (B', k), unfold them back, unfold column chunks into rows.

One job: the shape arithmetic behind ``DataProto.fold_batch_dim``, ``unfold_batch_dim`` and
``unfold_column_chunks`` (verl's operations of the same names). Each function takes the batch and the
non-tensor columns and returns the new ones; the DataProto method adds a copy of meta_info.

fold and unfold reshape every column alike, tensors and object arrays: fold makes a column (B, *) into
(B', B // B', *), so a folded object column is a 2-D object array; unfold merges the leading dims back.
Both return views where torch and numpy can (like ``select``, they share storage with the input).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from roll_ma.protocol.args import Keys, key_list, object_column

Columns = dict[str, np.ndarray]


def fold(batch: TensorDict, non_tensor: Columns, new_batch_size: int) -> tuple[TensorDict, Columns]:
    """Every column (B, *) -> (new_batch_size, B // new_batch_size, *); consecutive rows fold together."""
    rows = int(batch.batch_size[0])
    if new_batch_size <= 0 or rows % new_batch_size:
        raise ValueError(
            f"fold_batch_dim: {rows} rows cannot fold into {new_batch_size} rows (need >= 1, dividing B)"
        )
    per_row = rows // new_batch_size
    tensors = {k: t.reshape(new_batch_size, per_row, *t.shape[1:]) for k, t in batch.items()}
    columns = {k: c.reshape(new_batch_size, per_row, *c.shape[1:]) for k, c in non_tensor.items()}
    return TensorDict(tensors, batch_size=[new_batch_size], device=batch.device), columns


def unfold(batch: TensorDict, non_tensor: Columns, batch_dims: int) -> tuple[TensorDict, Columns]:
    """Every column's first ``batch_dims`` dims become one row dim: (B', k, *) -> (B' * k, *) for 2."""
    if batch_dims < 1:
        raise ValueError(f"unfold_batch_dim needs batch_dims >= 1, got {batch_dims}")
    shapes = {f"tensor {k!r}": tuple(t.shape) for k, t in batch.items()}
    shapes.update({f"non_tensor {k!r}": c.shape for k, c in non_tensor.items()})
    if not shapes:
        if batch_dims == 1:
            return batch, dict(non_tensor)
        raise ValueError("unfold_batch_dim: the batch has no column to read the folded dims from")
    for what, shape in shapes.items():
        if len(shape) < batch_dims:
            raise ValueError(
                f"unfold_batch_dim: {what} has shape {shape}, fewer than batch_dims={batch_dims} dims "
                "(fold_batch_dim makes (B', k, ...) columns)"
            )
    (first, lead), *rest = ((what, shape[:batch_dims]) for what, shape in shapes.items())
    for what, shape in rest:
        if shape != lead:
            raise ValueError(f"unfold_batch_dim: {what} has leading dims {shape} but {first} has {lead}")
    rows = math.prod(lead)
    tensors = {k: t.reshape(rows, *t.shape[batch_dims:]) for k, t in batch.items()}
    columns = {k: c.reshape(rows, *c.shape[batch_dims:]) for k, c in non_tensor.items()}
    return TensorDict(tensors, batch_size=[rows], device=batch.device), columns


def unfold_column_chunks(
    batch: TensorDict, non_tensor: Columns, n_split: int, split_keys: Keys
) -> tuple[TensorDict, Columns]:
    """Each row becomes n_split rows: a split key's dim 1 is cut into n_split chunks, one per new row;
    every other column repeats the row n_split times. No split keys: every column repeats.

    A 1-D object column (one object per row) splits each row's sequence (list, tuple, array, str) into
    n_split slices of equal length.
    """
    if n_split < 1:
        raise ValueError(f"unfold_column_chunks needs n_split >= 1, got {n_split}")
    keys = key_list(split_keys)
    for key in keys:
        if key not in batch.keys() and key not in non_tensor:
            names = list(batch.keys()) + list(non_tensor)
            raise ValueError(f"unfold_column_chunks: no column {key!r}; columns are {names}")
    rows = int(batch.batch_size[0])
    tensors = {
        k: _chunk_dim1(t, k, n_split) if k in keys else t.repeat_interleave(n_split, dim=0)
        for k, t in batch.items()
    }
    columns = {}
    for key, column in non_tensor.items():
        if key not in keys:
            columns[key] = np.repeat(column, n_split, axis=0)
        elif column.ndim >= 2:
            columns[key] = _chunk_dim1(column, key, n_split)
        else:
            columns[key] = object_column(
                [piece for row in column for piece in _slices(row, key, n_split)], key
            )
    return TensorDict(tensors, batch_size=[rows * n_split], device=batch.device), columns


def _chunk_dim1(column: Any, key: str, n_split: int) -> Any:
    """(B, L, *) -> (B * n_split, L // n_split, *) for a tensor or a numpy array."""
    shape = tuple(column.shape)
    if len(shape) < 2 or shape[1] % n_split:
        raise ValueError(
            f"unfold_column_chunks: {key!r} has shape {shape}; dim 1 must split into {n_split} equal chunks"
        )
    new_shape = (shape[0] * n_split, shape[1] // n_split, *shape[2:])
    return column.reshape(new_shape) if isinstance(column, torch.Tensor) else np.reshape(column, new_shape)


def _slices(row: Any, key: str, n_split: int) -> list[Any]:
    size = len(row) if hasattr(row, "__len__") else -1
    if size < 0 or size % n_split:
        raise ValueError(
            f"unfold_column_chunks: a row of non_tensor {key!r} holds {row!r}; it must be a sequence whose "
            f"length splits into {n_split} equal chunks"
        )
    step = size // n_split
    return [row[i * step : (i + 1) * step] for i in range(n_split)]
