"""roll_ma's DataProto under the names verl and ROLL give its parts: renaming only, no behaviour.

verl and ROLL call the per-row part ``non_tensor_batch`` (roll_ma: ``non_tensor``), its key argument
``non_tensor_batch_keys`` (roll_ma: ``non_tensor_keys``) and the repeat count ``repeat_times`` (roll_ma:
``n`` / ``counts``). Every call goes straight to roll_ma's method of the same job. A name roll_ma does not
have is bound to ``missing(name)``, so that one test fails on it instead of the whole file on import.
"""

from __future__ import annotations

from typing import Any

from roll_ma import protocol as ours
from roll_ma.protocol import io as protocol_io
from roll_ma.protocol import values as protocol_values


def missing(name: str) -> Any:
    """A stand-in for a peer name roll_ma does not provide: calling it fails and names it."""

    def stand_in(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"roll_ma has no counterpart of {name!r}")

    stand_in.__name__ = name
    return stand_in


def ours_or_missing(name: str) -> Any:
    """roll_ma's function of that name (protocol_values or protocol_io), else a stand-in: the suites run
    against older commits of roll_ma too."""
    for module in (ours, protocol_values, protocol_io):
        if hasattr(module, name):
            return getattr(module, name)
    return missing(name)


class DataProto(ours.DataProto):
    """roll_ma.protocol.DataProto with verl's and ROLL's argument and attribute names."""

    def __init__(self, *args, **kwargs):
        # verl/ROLL: DataProto(batch, non_tensor_batch, meta_info); roll_ma: (batch, non_tensor, meta_info)
        if "non_tensor_batch" in kwargs:
            kwargs["non_tensor"] = kwargs.pop("non_tensor_batch")
        super().__init__(*args, **kwargs)

    @property
    def non_tensor_batch(self):
        return self.non_tensor

    @non_tensor_batch.setter
    def non_tensor_batch(self, value):
        self.non_tensor = value

    def select(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None):
        return super().select(batch_keys, non_tensor_batch_keys, meta_info_keys)

    def pop(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None):
        return super().pop(batch_keys, non_tensor_batch_keys, meta_info_keys)

    def repeat(self, repeat_times=2, interleave=True):
        return super().repeat(repeat_times, interleave)

    def sample_level_repeat(self, repeat_times):
        return super().sample_level_repeat(repeat_times)
