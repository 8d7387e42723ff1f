"""Name-only shim: ``verl`` -> roll_ma (see ../peer_names.py)."""

from verl.protocol import DataProto

__all__ = ["DataProto"]
