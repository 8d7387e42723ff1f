"""Name-only shim: ``roll.distributed.scheduler.protocol`` -> roll_ma.protocol (see peer_names.py)."""

from peer_names import DataProto, missing, ours_or_missing

custom_np_concatenate = missing("custom_np_concatenate")
union_tensor_dict = ours_or_missing("union_tensor_dict")
union_numpy_dict = ours_or_missing("union_numpy_dict")


def pad_dataproto_to_divisor(data, size_divisor):
    return data.pad_to_multiple(size_divisor)


def unpad_dataproto(data, pad_size):
    return data.unpad(pad_size)


__all__ = ["DataProto", "custom_np_concatenate", "pad_dataproto_to_divisor", "unpad_dataproto"]
