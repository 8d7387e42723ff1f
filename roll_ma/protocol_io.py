"""DataProto <-> TensorDict and DataProto <-> a file on disk.

One job: the conversions behind ``DataProto.to_tensordict`` / ``from_tensordict`` and
``save_to_disk`` / ``load_from_disk``. In the TensorDict [B], tensors stay as they are, each
non-tensor column becomes a ``NonTensorStack`` (one object per row, sliced with the rows) and each
meta_info entry a ``NonTensorData`` (one value for the whole batch), as verl lays them out.
"""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tensordict import NonTensorData, NonTensorStack, TensorDict

if TYPE_CHECKING:
    from roll_ma.protocol import DataProto

D = TypeVar("D", bound="DataProto")


def to_tensordict(data: DataProto) -> TensorDict:
    """TensorDict [B]: tensors, then NonTensorStack per non-tensor column, NonTensorData per meta key."""
    td = data.batch.clone(recurse=False)
    for key, column in data.non_tensor.items():
        # one NonTensorData per row: from_list would turn a row's list into a nested stack
        td[key] = NonTensorStack(*[NonTensorData(v, batch_size=[]) for v in column], stack_dim=0)
    for key, value in data.meta_info.items():
        if key in td.keys():
            raise ValueError(f"to_tensordict: meta_info {key!r} has the name of a column")
        td.set_non_tensor(key, copy.deepcopy(value))
    return td


def tensordict_parts(td: TensorDict) -> tuple[TensorDict, dict[str, list[Any]], dict[str, Any]]:
    """(tensors [B], non-tensor columns, meta_info) of a TensorDict laid out as ``to_tensordict`` does."""
    if len(td.batch_size) != 1:
        raise ValueError(f"from_tensordict needs one batch dim, got batch_size={list(td.batch_size)}")
    tensors, non_tensor, meta = {}, {}, {}
    for key in td.keys():
        value = td.get(key)
        if isinstance(value, NonTensorStack):
            non_tensor[key] = value.tolist()
        elif isinstance(value, NonTensorData):
            meta[key] = copy.deepcopy(value.data)
        else:
            tensors[key] = value
    return TensorDict(tensors, batch_size=td.batch_size), non_tensor, meta


def save(data: DataProto, path: str | Path) -> None:
    """Pickle ``data`` to ``path`` with its tensors on the CPU, so that any machine can load it."""
    with open(path, "wb") as f:
        pickle.dump(data.to("cpu"), f, protocol=pickle.HIGHEST_PROTOCOL)


def load(cls: type[D], path: str | Path) -> D:
    """The ``cls`` saved at ``path`` (a pickle: load only files you trust)."""
    with open(path, "rb") as f:
        data = pickle.load(f)
    if not isinstance(data, cls):
        raise ValueError(f"{path} holds a {type(data).__name__}, not a {cls.__name__}")
    return data
