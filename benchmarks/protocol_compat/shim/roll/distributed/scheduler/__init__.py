"""Name-only shim: ``roll.distributed.scheduler``."""
