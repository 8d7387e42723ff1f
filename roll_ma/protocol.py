"""DataProto: the one batch type that flows between env, rollout, reference and train workers.

A DataProto is a table of B rows:

- ``batch``: a ``TensorDict`` with batch size ``[B]`` (every tensor's first dim is B),
- ``non_tensor``: a dict of numpy object arrays of length B (strings, ints, lists per row),
- ``meta_info``: a dict about the whole batch (sampling settings, step, metrics, ...).

Standard keys (the only place they are documented; P = prompt length, R = response length,
T = P + R; prompts are left-padded, responses right-padded, so the response of every row
occupies the last R columns of ``input_ids``):

batch (tensors)
    prompts            (B, P) int64   prompt token ids, left-padded with the pad id
    responses          (B, R) int64   generated token ids, right-padded with the pad id
    input_ids          (B, T) int64   ``cat(prompts, responses)``
    attention_mask     (B, T) int64   1 on real prompt and response tokens
    position_ids       (B, T) int64   ``cumsum(attention_mask) - 1``, clipped at 0
    response_mask      (B, R) float   1 on response tokens that count in the loss
    rollout_log_probs  (B, R) float   log pi_rollout(token) reported by the rollout engine
    old_log_probs      (B, R) float   log pi_old(token) from the train worker before the update
    ref_log_probs      (B, R) float   log pi_ref(token) from the base model (adapters off)
    token_rewards      (B, R) float   reward per token (the turn reward sits on the last token)
    advantages         (B, R) float   advantage per token
    returns            (B, R) float   return per token (advantage + baseline)
    scores             (B,)   float   scalar reward of the turn (env reward incl. penalties)

non_tensor (numpy object arrays, length B)
    agent_id           int    index of the acting agent in ``config.agents``
    adapter_version    int    version of that agent's adapter the rollout engine used
    episode_id         str    unique id of the episode the turn belongs to
    group_id           str    GRPO group: episodes started from the same seed / problem
    turn               int    index of the turn within its episode (0-based, all players)
    player             int    seat of the acting player
    env_name           str    name of the env that produced the row
    done               bool   whether the episode ended with this turn
    response_text      str    decoded response
    action_choices     list   token ids of each legal action's answer (games, only while
                              algorithm.action_entropy_coef is on; else [])

Rules: every operation keeps the three parts aligned; a mismatched length or key raises
``ValueError`` naming the key and both sizes; ``meta_info`` is copied, never shared, between
the pieces an operation returns.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

__all__ = ["DataProto"]


def _as_object_array(values: Any, key: str) -> np.ndarray:
    """One object per row, even when rows are lists (np.array would make a 2-D array)."""
    if isinstance(values, np.ndarray) and values.dtype == object and values.ndim == 1:
        return values
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__"):
        raise ValueError(f"non_tensor[{key!r}] must be a sequence with one value per row, got {type(values)}")
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _index_array(idxs: Any, length: int) -> np.ndarray:
    """Normalise an index array or bool mask to int64 positions."""
    if isinstance(idxs, torch.Tensor):
        idxs = idxs.cpu().numpy()
    idxs = np.asarray(idxs)
    if idxs.dtype == bool:
        if idxs.shape != (length,):
            raise ValueError(f"bool mask has shape {idxs.shape} but the batch has {length} rows")
        return np.nonzero(idxs)[0].astype(np.int64)
    if idxs.size == 0:
        return np.zeros(0, dtype=np.int64)
    if idxs.ndim != 1 or not np.issubdtype(idxs.dtype, np.integer):
        raise ValueError(f"row indices must be a 1-D int array or a bool mask, got {idxs.dtype} {idxs.shape}")
    if idxs.min() < -length or idxs.max() >= length:
        raise ValueError(f"row index out of range for a batch of {length} rows")
    return idxs.astype(np.int64)


@dataclass
class DataProto:
    """A batch of B rows: tensors, per-row Python objects and batch-level meta info."""

    batch: TensorDict
    non_tensor: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.batch.batch_size) != 1:
            raise ValueError(
                f"batch must have exactly one batch dim, got batch_size={list(self.batch.batch_size)}"
            )
        n = len(self)
        for key, values in list(self.non_tensor.items()):
            arr = _as_object_array(values, key)
            if len(arr) != n:
                raise ValueError(f"non_tensor[{key!r}] has {len(arr)} rows but the batch has {n}")
            self.non_tensor[key] = arr

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensors: dict[str, Sequence[Any]] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> DataProto:
        """Build from plain dicts; B is taken from the tensors, else from the non-tensor columns."""
        tensors = dict(tensors or {})
        non_tensors = dict(non_tensors or {})
        lengths = {f"batch[{k!r}]": int(v.shape[0]) for k, v in tensors.items()}
        lengths.update({f"non_tensor[{k!r}]": len(v) for k, v in non_tensors.items()})
        if len(set(lengths.values())) > 1:
            (k0, n0), *rest = lengths.items()
            k1, n1 = next((k, n) for k, n in rest if n != n0)
            raise ValueError(f"{k1} has {n1} rows but {k0} has {n0}")
        n = next(iter(lengths.values()), 0)
        batch = TensorDict(tensors, batch_size=[n])
        return cls(batch=batch, non_tensor=non_tensors, meta_info=dict(meta_info or {}))

    @classmethod
    def empty(cls, meta_info: dict[str, Any] | None = None) -> DataProto:
        return cls(batch=TensorDict({}, batch_size=[0]), meta_info=dict(meta_info or {}))

    # ---------------------------------------------------------------- basics
    def __len__(self) -> int:
        return int(self.batch.batch_size[0])

    def __getitem__(self, item: int | slice | Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        if isinstance(item, int):
            item = [item]
        if isinstance(item, slice):
            item = np.arange(len(self))[item]
        return self.select_idxs(item)

    @property
    def keys(self) -> list[str]:
        return list(self.batch.keys()) + list(self.non_tensor.keys())

    def __repr__(self) -> str:
        tensors = ", ".join(f"{k}: {tuple(v.shape)} {v.dtype}" for k, v in self.batch.items())
        return (
            f"DataProto(len={len(self)}, batch={{{tensors}}}, non_tensor={list(self.non_tensor)}, "
            f"meta_info={list(self.meta_info)})"
        )

    def to(self, device: str | torch.device) -> DataProto:
        return DataProto(self.batch.to(device), dict(self.non_tensor), copy.copy(self.meta_info))

    # ---------------------------------------------------------------- selection
    def select(
        self,
        batch_keys: Sequence[str] | None = None,
        non_tensor_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
    ) -> DataProto:
        """Keep only the named columns (None keeps all of that part)."""
        for key in batch_keys or []:
            if key not in self.batch.keys():
                raise ValueError(f"select: no tensor {key!r}; tensors are {list(self.batch.keys())}")
        for key in non_tensor_keys or []:
            if key not in self.non_tensor:
                raise ValueError(f"select: no non_tensor {key!r}; non_tensors are {list(self.non_tensor)}")
        batch = self.batch.select(*batch_keys) if batch_keys is not None else self.batch.clone(recurse=False)
        non_tensor = (
            {k: self.non_tensor[k] for k in non_tensor_keys}
            if non_tensor_keys is not None
            else dict(self.non_tensor)
        )
        meta = (
            {k: copy.deepcopy(self.meta_info[k]) for k in meta_info_keys if k in self.meta_info}
            if meta_info_keys is not None
            else copy.deepcopy(self.meta_info)
        )
        return DataProto(batch, non_tensor, meta)

    def select_idxs(self, idxs: Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Rows at the given positions (an int index array, or a bool mask of length B)."""
        positions = _index_array(idxs, len(self))
        batch = self.batch[torch.from_numpy(positions)]
        non_tensor = {k: v[positions] for k, v in self.non_tensor.items()}
        return DataProto(batch, non_tensor, copy.deepcopy(self.meta_info))

    # ---------------------------------------------------------------- combining
    @classmethod
    def concat(cls, parts: Sequence[DataProto]) -> DataProto:
        """Stack rows of several DataProtos with the same keys; meta_info comes from the first part."""
        if not parts:
            raise ValueError("concat needs at least one DataProto")
        first = parts[0]
        batch_keys, nt_keys = set(first.batch.keys()), set(first.non_tensor)
        for i, part in enumerate(parts[1:], start=1):
            for key in batch_keys ^ set(part.batch.keys()):
                where = "part 0" if key in batch_keys else f"part {i}"
                raise ValueError(f"concat: tensor {key!r} is in {where} only (parts 0 and {i} differ)")
            for key in nt_keys ^ set(part.non_tensor):
                where = "part 0" if key in nt_keys else f"part {i}"
                raise ValueError(f"concat: non_tensor {key!r} is in {where} only (parts 0 and {i} differ)")
            for key in batch_keys:
                a, b = first.batch[key].shape[1:], part.batch[key].shape[1:]
                if a != b:
                    raise ValueError(
                        f"concat: tensor {key!r} has row shape {tuple(a)} in part 0 "
                        f"but {tuple(b)} in part {i}"
                    )
        batch = (
            torch.cat([p.batch for p in parts], dim=0)
            if batch_keys
            else TensorDict({}, batch_size=[sum(len(p) for p in parts)])
        )
        non_tensor = {k: np.concatenate([p.non_tensor[k] for p in parts]) for k in first.non_tensor}
        return cls(batch, non_tensor, copy.deepcopy(first.meta_info))

    def union(self, other: DataProto) -> DataProto:
        """Columns of both; shared columns must hold equal values."""
        if len(self) != len(other):
            raise ValueError(f"union: this batch has {len(self)} rows but the other has {len(other)}")
        tensors = dict(self.batch.items())
        for key, value in other.batch.items():
            if key in tensors and not torch.equal(tensors[key], value):
                raise ValueError(f"union: tensor {key!r} is in both batches with different values")
            tensors[key] = value
        non_tensor = dict(self.non_tensor)
        for key, value in other.non_tensor.items():
            if key in non_tensor and not np.array_equal(non_tensor[key], value):
                raise ValueError(f"union: non_tensor {key!r} is in both batches with different values")
            non_tensor[key] = value
        meta = copy.deepcopy(self.meta_info)
        for key, value in other.meta_info.items():
            if key in meta and meta[key] != value:
                raise ValueError(f"union: meta_info {key!r} differs: {meta[key]!r} vs {value!r}")
            meta[key] = copy.deepcopy(value)
        return DataProto(TensorDict(tensors, batch_size=[len(self)]), non_tensor, meta)

    # ---------------------------------------------------------------- splitting
    def split(self, sizes: Sequence[int]) -> list[DataProto]:
        """Consecutive pieces of the given sizes (they must add up to B)."""
        if sum(sizes) != len(self) or any(s < 0 for s in sizes):
            raise ValueError(
                f"split sizes {list(sizes)} add up to {sum(sizes)} but the batch has {len(self)} rows"
            )
        bounds = np.cumsum([0, *sizes])
        return [self.select_idxs(np.arange(bounds[i], bounds[i + 1])) for i in range(len(sizes))]

    def chunk(self, n: int) -> list[DataProto]:
        """n consecutive pieces whose sizes differ by at most one (the first ones are larger)."""
        if n <= 0:
            raise ValueError(f"chunk needs n >= 1, got {n}")
        base, extra = divmod(len(self), n)
        return self.split([base + (1 if i < extra else 0) for i in range(n)])

    def repeat(self, n: int, interleave: bool = True) -> DataProto:
        """Each row n times: [a, a, b, b] with interleave, else [a, b, a, b]."""
        if n <= 0:
            raise ValueError(f"repeat needs n >= 1, got {n}")
        rows = np.arange(len(self))
        order = np.repeat(rows, n) if interleave else np.tile(rows, n)
        return self.select_idxs(order)

    def group_by(self, key: str) -> dict[Any, tuple[DataProto, np.ndarray]]:
        """{value: (rows with that value, their original positions)}, values in sorted order."""
        if key in self.non_tensor:
            column = self.non_tensor[key]
        elif key in self.batch.keys() and self.batch[key].ndim == 1:
            column = self.batch[key].cpu().numpy()
        else:
            raise ValueError(f"group_by: no 1-D column {key!r}; columns are {self.keys}")
        groups: dict[Any, list[int]] = {}
        for i, value in enumerate(column.tolist()):
            groups.setdefault(value, []).append(i)
        ordered = sorted(groups, key=lambda v: (str(type(v)), v))
        return {
            v: (self.select_idxs(np.asarray(groups[v])), np.asarray(groups[v], dtype=np.int64))
            for v in ordered
        }

    @classmethod
    def ungroup(
        cls, groups: Sequence[tuple[DataProto, np.ndarray]] | dict[Any, tuple[DataProto, np.ndarray]]
    ) -> DataProto:
        """Inverse of group_by: put each group's rows back at their original positions."""
        parts = list(groups.values()) if isinstance(groups, dict) else list(groups)
        if not parts:
            raise ValueError("ungroup needs at least one group")
        for i, (data, idx) in enumerate(parts):
            if len(data) != len(idx):
                raise ValueError(f"ungroup: group {i} has {len(data)} rows but {len(idx)} positions")
        positions = np.concatenate([np.asarray(idx, dtype=np.int64) for _, idx in parts])
        total = len(positions)
        if not np.array_equal(np.sort(positions), np.arange(total)):
            raise ValueError(f"ungroup: positions must cover 0..{total - 1} exactly once")
        stacked = cls.concat([data for data, _ in parts])
        inverse = np.empty(total, dtype=np.int64)
        inverse[positions] = np.arange(total)
        return stacked.select_idxs(inverse)

    # ---------------------------------------------------------------- padding
    def pad_to_multiple(self, n: int) -> tuple[DataProto, int]:
        """Append copies of the first rows so that B is a multiple of n; returns (padded, pad_size).

        Padded rows are real copies: callers that train on them must mask them (unpad first).
        """
        if n <= 0:
            raise ValueError(f"pad_to_multiple needs n >= 1, got {n}")
        if len(self) == 0:
            return self.select(), 0
        pad_size = (-len(self)) % n
        if pad_size == 0:
            return self.select(), 0
        order = np.concatenate([np.arange(len(self)), np.arange(pad_size) % len(self)])
        return self.select_idxs(order), pad_size

    def unpad(self, pad_size: int) -> DataProto:
        """Drop the last pad_size rows added by pad_to_multiple."""
        if pad_size < 0 or pad_size > len(self):
            raise ValueError(f"unpad: pad_size {pad_size} out of range for {len(self)} rows")
        return self.select_idxs(np.arange(len(self) - pad_size))

    # ---------------------------------------------------------------- iteration
    def iter_minibatches(
        self, batch_size: int, shuffle: bool = False, seed: int | None = None, drop_last: bool = False
    ) -> Iterator[DataProto]:
        """Mini-batches of batch_size rows; shuffled with a private generator when asked."""
        if batch_size <= 0:
            raise ValueError(f"mini-batch size must be >= 1, got {batch_size}")
        order = np.arange(len(self))
        if shuffle:
            order = np.random.default_rng(seed).permutation(len(self))
        stop = len(self) - (len(self) % batch_size if drop_last else 0)
        for start in range(0, stop, batch_size):
            yield self.select_idxs(order[start : start + batch_size])
