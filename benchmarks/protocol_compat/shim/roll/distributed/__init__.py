"""Name-only shim: ``roll.distributed``."""
