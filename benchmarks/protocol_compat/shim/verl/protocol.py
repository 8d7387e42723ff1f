"""Name-only shim: ``verl.protocol`` -> roll_ma.protocol (see ../peer_names.py)."""

from peer_names import DataProto, missing, ours_or_missing


def pad_dataproto_to_divisor(data, size_divisor):
    return data.pad_to_multiple(size_divisor)


def unpad_dataproto(data, pad_size):
    return data.unpad(pad_size)


def fold_batch_dim(data, new_batch_size):
    return data.fold_batch_dim(new_batch_size)


def unfold_batch_dim(data, batch_dims=2):
    return data.unfold_batch_dim(batch_dims)


union_tensor_dict = ours_or_missing("union_tensor_dict")
union_numpy_dict = ours_or_missing("union_numpy_dict")
serialize_single_tensor = ours_or_missing("serialize_single_tensor")
deserialize_single_tensor = ours_or_missing("deserialize_single_tensor")
serialize_tensordict = ours_or_missing("serialize_tensordict")
deserialize_tensordict = ours_or_missing("deserialize_tensordict")

__all__ = [
    "DataProto",
    "missing",
    "pad_dataproto_to_divisor",
    "unpad_dataproto",
    "fold_batch_dim",
    "unfold_batch_dim",
    "union_tensor_dict",
    "union_numpy_dict",
    "serialize_single_tensor",
    "deserialize_single_tensor",
    "serialize_tensordict",
    "deserialize_tensordict",
]
