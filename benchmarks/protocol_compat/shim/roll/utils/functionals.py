"""Name-only shim: ``roll.utils.functionals`` (roll_ma has no counterpart of its metric reducer)."""

from peer_names import missing

reduce_metrics = missing("roll.utils.functionals.reduce_metrics")
