"""Name-only shim: ``roll`` -> roll_ma (see ../peer_names.py)."""
