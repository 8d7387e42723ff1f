"""Name-only shim: ``verl.utils.tensordict_utils`` (roll_ma has no counterpart module)."""

from peer_names import missing

get_tensordict = missing("verl.utils.tensordict_utils.get_tensordict")
