"""A resumable, deterministically shuffled list of math problems."""

from __future__ import annotations

import random

from roll_ma.data.math_files import load_math_records
from roll_ma.data.synthetic import generate_arithmetic


class MathDataset:
    """Problems served in batches, reshuffled each epoch from (seed, epoch), with a cursor.

    The order of epoch e depends only on (seed, e), so a run resumed from `state_dict()`
    sees exactly the batches the uninterrupted run would have seen. A batch may span the end
    of an epoch: it continues with the start of the next epoch's order.

    Args:
        records: `{"problem", "answer"}` dicts.
        seed: Seed of the shuffles.
        shuffle: False keeps the file order in every epoch.
    """

    def __init__(self, records: list[dict], seed: int = 0, shuffle: bool = True):
        if not records:
            raise ValueError("MathDataset needs at least one record")
        self.records = list(records)
        self.seed = int(seed)
        self.shuffle = bool(shuffle)
        self.epoch = 0
        self.cursor = 0
        self._order = self.epoch_order(0)

    @classmethod
    def from_file(cls, path: str, preset: str | None = None, seed: int = 0, shuffle: bool = True, **kwargs):
        """Load a local file with `load_math_records` (kwargs: problem_key, answer_key, limit)."""
        return cls(load_math_records(path, preset=preset, **kwargs), seed=seed, shuffle=shuffle)

    @classmethod
    def from_synthetic(cls, n: int, level: int = 2, seed: int = 0, shuffle: bool = True):
        """`n` synthetic arithmetic problems of `level` (generated from `seed`)."""
        return cls(generate_arithmetic(n, level=level, seed=seed), seed=seed, shuffle=shuffle)

    def __len__(self) -> int:
        return len(self.records)

    def epoch_order(self, epoch: int) -> list[int]:
        """Record indices in the order of `epoch`."""
        order = list(range(len(self.records)))
        if self.shuffle:
            random.Random(f"math-dataset:{self.seed}:{epoch}").shuffle(order)
        return order

    def next_batch(self, n: int) -> list[dict]:
        """The next `n` records (copies), moving the cursor and the epoch as needed."""
        if n < 0:
            raise ValueError(f"batch size must be >= 0, got {n}")
        batch: list[dict] = []
        while len(batch) < n:
            if self.cursor >= len(self._order):
                self.epoch += 1
                self.cursor = 0
                self._order = self.epoch_order(self.epoch)
            take = min(n - len(batch), len(self._order) - self.cursor)
            batch.extend(dict(self.records[i]) for i in self._order[self.cursor : self.cursor + take])
            self.cursor += take
        return batch

    def state_dict(self) -> dict:
        """Everything needed to resume: seed, epoch, cursor and the data size (checked on load)."""
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "cursor": self.cursor,
            "num_records": len(self.records),
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume from `state_dict()`; the records must be the same data set."""
        if int(state["num_records"]) != len(self.records):
            raise ValueError(
                f"data cursor was saved for {state['num_records']} records but this dataset has "
                f"{len(self.records)}; resume with the same data files"
            )
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.cursor = int(state["cursor"])
        self._order = self.epoch_order(self.epoch)
