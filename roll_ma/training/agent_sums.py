"""Per-agent metric sums of an update, as a small table with named columns.

An update adds, for every micro-batch, each agent's share of a few quantities (loss sum, tokens, ...);
after the last micro-batch the table is reduced over the data-parallel ranks and each metric is a
ratio of two of its columns (``policy_loss / units``). Columns are read by name, never by position.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from roll_ma.training.ds_utils import all_reduce_max, all_reduce_sum


def row_slots(agent_of_row: np.ndarray, agent_ids: list[int]) -> torch.Tensor:
    """(N,) the position of each row's agent in ``agent_ids`` (its slot in the per-agent sums)."""
    slot_of = {a: s for s, a in enumerate(agent_ids)}
    return torch.tensor([slot_of[int(a)] for a in agent_of_row], dtype=torch.long)


class AgentSums:
    """(slots, fields) float64 CPU table: one row per agent slot, one column per named quantity.

    Args:
        fields: the column names.
        slots: the number of agents (rows).
        reduce: how ranks combine it: "sum" (totals) or "max" (largest values).
    """

    def __init__(self, fields: Sequence[str], slots: int, reduce: str = "sum"):
        assert reduce in ("sum", "max"), reduce
        self.fields = tuple(fields)
        self.reduce = reduce
        self.values = torch.zeros(slots, len(self.fields), dtype=torch.float64)  # (slots, fields)

    def add(self, slot: int, values: Mapping[str, float]) -> None:
        """Add one micro-batch's quantities of agent ``slot`` (every field, by name)."""
        assert len(values) == len(self.fields), (sorted(values), self.fields)
        self.values[slot] += torch.tensor([values[f] for f in self.fields], dtype=torch.float64)

    def raise_to(self, slot: int, field: str, value: float) -> None:
        """Keep the larger of the stored and the given value (a "max" table)."""
        col = self.fields.index(field)
        self.values[slot, col] = max(float(self.values[slot, col]), value)

    def reduced(self, device: torch.device) -> AgentSums:
        """A copy combined over the data-parallel ranks (sum or max, as this table reduces)."""
        out = AgentSums(self.fields, len(self.values), self.reduce)
        reduce = all_reduce_sum if self.reduce == "sum" else all_reduce_max
        out.values = reduce(self.values, device)
        return out

    def row(self, slot: int) -> dict[str, float]:
        """Agent ``slot``'s quantities by name."""
        return dict(zip(self.fields, self.values[slot].tolist(), strict=True))
