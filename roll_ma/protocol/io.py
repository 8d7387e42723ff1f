"""DataProto <-> TensorDict, DataProto <-> a file on disk, TensorDict <-> numpy byte buffers.

One job: the conversions behind ``DataProto.to_tensordict`` / ``from_tensordict`` and
``save_to_disk`` / ``load_from_disk``. In the TensorDict [B], tensors stay as they are, each
non-tensor column becomes a ``NonTensorStack`` (one object per row, sliced with the rows) and each
meta_info entry a ``NonTensorData`` (one value for the whole batch), as verl lays them out.

``serialize_tensordict`` / ``deserialize_tensordict`` (verl's names and layout) give a TensorDict as plain
data: per tensor (dtype name, shape, uint8 numpy buffer), per nested tensor (layout, [its tensors]).
Ray stores numpy buffers without pickling them (see ``roll_ma.distributed.tensor_transfer`` for the
measured gain), and the form loads without running code, unlike a pickle.
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict

D = TypeVar("D")  # a DataProto (this module is below protocol.py: it never imports it)


def to_tensordict(batch: TensorDict, non_tensor: dict[str, Any], meta_info: dict[str, Any]) -> TensorDict:
    """A DataProto's parts as one TensorDict [B]: tensors, then a NonTensorStack per non-tensor column and
    a NonTensorData per meta_info key."""
    td = batch.clone(recurse=False)
    for key, column in non_tensor.items():
        # one NonTensorData per row: from_list would turn a row's list into a nested stack
        td[key] = NonTensorStack(*[NonTensorData(v, batch_size=[]) for v in column], stack_dim=0)
    for key, value in meta_info.items():
        if key in td.keys():
            raise ValueError(f"to_tensordict: meta_info {key!r} has the name of a column")
        td.set_non_tensor(key, copy.deepcopy(value))
    return td


def tensordict_parts(td: TensorDict) -> tuple[TensorDict, dict[str, list[Any]], dict[str, Any]]:
    """(tensors [B], non-tensor columns, meta_info) of a TensorDict laid out as ``to_tensordict`` does."""
    if len(td.batch_size) != 1:
        raise ValueError(f"from_tensordict needs one batch dim, got batch_size={list(td.batch_size)}")
    tensors: dict[str, Any] = {}
    non_tensor: dict[str, list[Any]] = {}
    meta: dict[str, Any] = {}
    for key in cast(list[str], list(td.keys())):  # top-level keys are str (the stubs say NestedKey)
        value = td.get(key)
        if isinstance(value, NonTensorStack):
            non_tensor[key] = value.tolist()
        elif isinstance(value, NonTensorData):
            meta[key] = copy.deepcopy(value.data)
        else:
            tensors[key] = value
    return TensorDict(tensors, batch_size=td.batch_size), non_tensor, meta


def save(data: Any, path: str | Path) -> None:
    """Pickle ``data`` (a DataProto) to ``path`` with its tensors on the CPU, so any machine can load it."""
    with open(path, "wb") as f:
        pickle.dump(data.to("cpu"), f, protocol=pickle.HIGHEST_PROTOCOL)


def load(cls: type[D], path: str | Path) -> D:
    """The ``cls`` saved at ``path`` (a pickle: load only files you trust)."""
    with open(path, "rb") as f:
        data = pickle.load(f)
    if not isinstance(data, cls):
        raise ValueError(f"{path} holds a {type(data).__name__}, not a {cls.__name__}")
    return data


def serialize_single_tensor(tensor: torch.Tensor) -> tuple[str, tuple[int, ...], np.ndarray]:
    """(dtype name, shape, the bytes as a (nbytes,) uint8 numpy array on the host) of any dense tensor."""
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), flat.view(torch.uint8).numpy()


def deserialize_single_tensor(encoded: tuple[str, tuple[int, ...], Any]) -> torch.Tensor:
    """The tensor of ``serialize_single_tensor`` (its own writable storage; any bytes-like data)."""
    dtype_name, shape, data = encoded
    dtype = getattr(torch, dtype_name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"deserialize_single_tensor: {dtype_name!r} is not a torch dtype")
    raw = torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())
    if raw.numel() == 0:  # torch cannot view an empty byte tensor as a wider dtype
        return torch.empty(shape, dtype=dtype)
    return raw.view(dtype).reshape(shape)


def serialize_tensordict(td: TensorDict) -> tuple[tuple[int, ...], str | None, dict[str, tuple[Any, ...]]]:
    """(batch size, device name or None, {key: serialize_single_tensor(t) or (layout, [parts])})."""
    items: dict[str, tuple[Any, ...]] = {}
    for key, value in td.items():
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"serialize_tensordict: {key!r} holds a {type(value).__name__}, not a tensor")
        if value.is_nested:
            layout = str(value.layout).removeprefix("torch.")
            items[key] = (layout, [serialize_single_tensor(t) for t in value.unbind()])
        else:
            items[key] = serialize_single_tensor(value)
    return tuple(td.batch_size), None if td.device is None else str(td.device), items


def deserialize_tensordict(encoded: tuple[Any, str | None, dict[str, tuple[Any, ...]]]) -> TensorDict:
    """The TensorDict of ``serialize_tensordict``, on the device it names."""
    batch_size, device, items = encoded
    tensors = {}
    for key, value in items.items():
        if len(value) == 3:
            tensors[key] = deserialize_single_tensor(value)
        elif len(value) == 2:
            layout, parts = value
            tensors[key] = torch.nested.as_nested_tensor(
                [deserialize_single_tensor(p) for p in parts], layout=getattr(torch, layout)
            )
        else:
            raise ValueError(
                f"deserialize_tensordict: {key!r} has {len(value)} fields, expected 3 (nested: 2)"
            )
    return TensorDict(tensors, batch_size=batch_size, device=device)
