"""Name-only shim: ``roll.utils``."""
