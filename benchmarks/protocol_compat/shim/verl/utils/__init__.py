"""Name-only shim: ``verl.utils``."""
