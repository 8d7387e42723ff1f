"""DataProto: the one batch type that flows between env, rollout, reference and train workers.

A DataProto is a table of B rows:

- ``batch``: a ``TensorDict`` with batch size ``[B]`` (every tensor's first dim is B),
- ``non_tensor``: a dict of numpy object arrays with B rows (strings, ints, lists per row; 1-D, except
  that fold_batch_dim makes them (B', k)),
- ``meta_info``: a dict about the whole batch (``pad_id``, the episodes' summaries). What a caller asks
  of a worker (objective, step, policies; greedy, seed, temperature of sampling) is a typed request
  beside the batch (``roll_ma.protocol.requests``, which lists what meta_info still holds), not a key here.

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
    returns            (B, R) float   return per token (advantage + baseline; gae: the critic's targets)
    values             (B, R) float   gae: V(prefix before the token) from the row's agent's critic
    scores             (B,)   float   scalar reward of the turn (env reward incl. penalties)
    trained_rewards    (B,)   float   the turn reward trained on (scores, plus the team's with
                                      algorithm.share_reward_in_agent)

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
                              study.action_entropy_coef is on; else [])

Rules: every operation keeps the three parts aligned; a mismatched length or key raises
``ValueError`` naming the key and both sizes; ``meta_info`` is copied, never shared, between
the pieces an operation returns; operations return ``type(self)``, so subclasses survive them.
Storage: row operations (indexing, repeat, split, concat, ...) copy tensors and arrays, but the Python
objects in object rows stay shared; ``select``, ``to`` on the same device, ``union``, ``pop``,
``fold_batch_dim`` and ``unfold_batch_dim`` hand out the same tensors and object arrays (or views of
them), so an in-place edit shows in both. ``clone()`` copies everything, row objects included.

Operations. Shapes count rows: a column (B, *) keeps its row shape *, and the result gets a copy
of meta_info. "new": returns a new DataProto and leaves self as it was; "in place": changes self.

rows
    d[i], d[np.int64(i)], d[torch.tensor(i)]  (B, *) -> (1, *)           new
    d[a:b:c], d[idx], select_idxs(idx)        (B, *) -> (len(idx), *)    new; (B,) bool mask: mask.sum() rows
    reorder(perm)                             (B, *) -> (B, *)           in place (pure: select_idxs(perm))
    repeat(n, interleave=True)                (B, *) -> (n*B, *)         new: [a, a, b, b], else [a, b, a, b]
    sample_level_repeat(counts)               (B, *) -> (sum(counts), *) new: row i counts[i] times in a row
    pad_to_multiple(n) -> (padded, pad)       (B, *) -> (B + pad, *)     new: copies of first rows appended
    unpad(pad)                                (B + pad, *) -> (B, *)     new
columns (B rows in and out)
    select(batch_keys, non_tensor_keys, meta_info_keys)   new, the named keys only (None keeps that part);
                                              shares the tensors and arrays with self (see Storage)
    pop(batch_keys, non_tensor_keys, meta_info_keys)      in place: removes the keys, returns them (B rows)
    rename(old_keys, new_keys)                in place, returns self: tensor or non-tensor columns renamed
    union(other)                              new, the columns of both; a key in both must be equal
    clone()                                   new, a deep copy: tensors, object columns, meta_info
reshape (rows)
    fold_batch_dim(b)                         (B, *) -> (b, B // b, *)       new, every column (b divides B)
    unfold_batch_dim(n=2)                     (b, k, *) -> (b * k, *)        new, the first n dims -> rows
    unfold_column_chunks(n, split_keys)       (B, L, *) -> (n * B, L // n, *) for split keys, the rest
                                              repeated [a, a, b, b]; a 1-D object column splits each row
pieces
    chunk(n)                                  n pieces of B // n or B // n + 1 rows (the larger ones first)
    split(size) / split([s0, s1, ...])        pieces of size rows (the last smaller) / of the listed sizes
    concat(parts, global_keys=None)           parts (B_i, *) -> (sum B_i, *), new; meta_info merged below
    group_by(key) / group_by([k1, k2])        {value / (v1, v2): (its rows, their positions (N,) int64)}
    ungroup(groups)                           the groups' rows back at their positions, (B, *), new
    make_iterator(mini_batch_size, epochs=1, seed=None, shuffle=False, drop_last=False)
                                              per epoch ceil(B / mini_batch_size) pieces (mini_batch_size, *)
conversion
    to(device)                                new, tensors on device
    from_dict(tensors, non_tensors, meta) / from_single_dict(one dict, meta)   tensors split from the rest
    to_tensordict() / from_tensordict(td)     TensorDict [B]: the tensors, a NonTensorStack (one object per
                                              row) per non-tensor column, a NonTensorData per meta_info key
    save_to_disk(path) / load_from_disk(path)  a pickle, tensors on the CPU (load only files you trust)
    check_consistency()                       raises ValueError naming the key that breaks the rules

Equal (union) means deep equality with NaN == NaN (containers that hold themselves compare too).
concat merges meta_info key by key (see ``roll_ma.protocol.values``): if the parts that carry a key agree,
the value once; else a list with one entry per part, in part order (None where a part lacks it).
``metrics`` (name -> number per worker, or a list of such reports) merges name by name: one value where
the reports agree, else the list of every reported number, so ``np.mean`` reduces either form; keys in
``global_keys`` are gathered (per part, or name by name for dicts) even when the parts agree.
verl's module functions live by job: ``protocol.values.union_tensor_dict`` / ``union_numpy_dict`` (in
place into the first dict, like verl's), ``protocol.io.serialize_tensordict`` / ``deserialize_tensordict``.

Different from verl on purpose (docs/dataproto.md has the list, with verl's and ROLL's own tests run
against this class): ``d[i]`` is a one-row DataProto (verl: a DataProtoItem); ``chunk(n)`` takes any B;
every operation but pop, rename and reorder is pure (verl's ``union`` and ``to`` change self); concat
merges meta_info (verl asserts that shared keys agree, ROLL keeps the first part's value);
``make_iterator`` takes ``shuffle`` and ``drop_last`` (verl: DataLoader kwargs) and its last piece may
be smaller; ``group_by`` returns positions too, so ``ungroup`` restores the order; ``rename`` renames
non-tensor columns too; the per-row part and its key argument are ``non_tensor`` / ``non_tensor_keys``
(verl: ``non_tensor_batch`` / ``non_tensor_batch_keys``).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import torch
from tensordict import TensorDict

from roll_ma.protocol import args, reshape
from roll_ma.protocol import io as protocol_io
from roll_ma.protocol.args import Keys
from roll_ma.protocol.values import ConflictingValuesError, merge_meta_info, union_columns, values_equal

__all__ = ["DataProto"]

Index = int | slice | Sequence[int] | np.ndarray | torch.Tensor
Self = TypeVar("Self", bound="DataProto")


@dataclass
class DataProto:
    """A batch of B rows: tensors, per-row Python objects and batch-level meta info.

    Any part may be given as None, as verl and ROLL allow: no tensors (B is then the non-tensor
    columns' length), no non-tensor columns, no meta_info.
    """

    batch: TensorDict = None  # type: ignore[assignment]  # None becomes an empty TensorDict of B rows
    non_tensor: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.non_tensor = {key: args.object_column(v, key) for key, v in (self.non_tensor or {}).items()}
        self.meta_info = {} if self.meta_info is None else self.meta_info
        if self.batch is None:
            rows = len(next(iter(self.non_tensor.values()))) if self.non_tensor else 0
            self.batch = TensorDict({}, batch_size=[rows])
        self.check_consistency()

    def check_consistency(self) -> None:
        """Raise ValueError naming the key that breaks the rules (call it after editing the fields)."""
        if not isinstance(self.batch, TensorDict) or len(self.batch.batch_size) != 1:
            size = list(getattr(self.batch, "batch_size", []))
            raise ValueError(f"batch must be a TensorDict with exactly one batch dim, got batch_size={size}")
        n = len(self)
        for key, arr in self.non_tensor.items():
            if not (isinstance(arr, np.ndarray) and arr.dtype == object and arr.ndim >= 1):
                kind = f"an array of {arr.dtype}" if hasattr(arr, "dtype") else f"a {type(arr).__name__}"
                raise ValueError(f"non_tensor[{key!r}] must be a numpy object array of B rows, got {kind}")
            if len(arr) != n:
                raise ValueError(f"non_tensor[{key!r}] has {len(arr)} rows but the batch has {n}")
            if key in self.batch.keys():
                raise ValueError(f"{key!r} is both a tensor and a non_tensor column")
        if not isinstance(self.meta_info, dict):
            raise ValueError(f"meta_info must be a dict, got {type(self.meta_info)}")

    def _new(self: Self, batch: TensorDict, non_tensor: dict[str, np.ndarray], meta: dict[str, Any]) -> Self:
        # dataclasses.replace builds type(self) and keeps the fields a subclass adds
        return dataclasses.replace(self, batch=batch, non_tensor=non_tensor, meta_info=meta)

    # ---------------------------------------------------------------- construction and conversion
    @classmethod
    def from_dict(
        cls: type[Self],
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Sequence[Any] | np.ndarray] | None = None,
        meta_info: dict[str, Any] | None = None,
    ) -> Self:
        """Build from plain dicts; B is taken from the tensors, else from the non-tensor columns."""
        tensors, raw = dict(tensors or {}), dict(non_tensors or {})
        batch = TensorDict(tensors, batch_size=[args.common_length(tensors, raw)])
        columns = {key: args.object_column(v, key) for key, v in raw.items()}
        return cls(batch=batch, non_tensor=columns, meta_info=dict(meta_info or {}))

    @classmethod
    def from_single_dict(
        cls: type[Self], data: dict[str, Any], meta_info: dict[str, Any] | None = None
    ) -> Self:
        """verl's and ROLL's one-dict from_dict: tensors become tensor columns, the rest object columns."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        return cls.from_dict(tensors, {k: v for k, v in data.items() if k not in tensors}, meta_info)

    @classmethod
    def empty(cls: type[Self], meta_info: dict[str, Any] | None = None) -> Self:
        return cls(batch=TensorDict({}, batch_size=[0]), meta_info=dict(meta_info or {}))

    def to_tensordict(self) -> TensorDict:
        """TensorDict [B] of tensors, non-tensor columns (NonTensorStack) and meta_info (NonTensorData)."""
        return protocol_io.to_tensordict(self.batch, self.non_tensor, self.meta_info)

    @classmethod
    def from_tensordict(cls: type[Self], td: TensorDict) -> Self:
        """Inverse of to_tensordict; a TensorDict of tensors only gives a batch without non-tensor columns."""
        batch, non_tensor, meta = protocol_io.tensordict_parts(td)
        columns = {key: args.object_column(v, key) for key, v in non_tensor.items()}
        return cls(batch=batch, non_tensor=columns, meta_info=meta)

    def save_to_disk(self, path: str | Path) -> None:
        """Pickle to ``path`` with the tensors on the CPU."""
        protocol_io.save(self, path)

    @classmethod
    def load_from_disk(cls: type[Self], path: str | Path) -> Self:
        """Read a file written by save_to_disk (a pickle: load only files you trust)."""
        return protocol_io.load(cls, path)

    # ---------------------------------------------------------------- basics
    def __len__(self) -> int:
        return int(self.batch.batch_size[0])

    def __getitem__(self: Self, item: Index) -> Self:
        if isinstance(item, slice):
            item = np.arange(len(self))[item]
        return self.select_idxs(item)

    @property
    def keys(self) -> list[str]:
        # why the cast: the top-level keys of a TensorDict are str (the stubs say NestedKey)
        return cast(list[str], list(self.batch.keys())) + list(self.non_tensor.keys())

    def __repr__(self) -> str:
        tensors = ", ".join(f"{k}: {tuple(v.shape)} {v.dtype}" for k, v in self.batch.items())
        return (
            f"{type(self).__name__}(len={len(self)}, batch={{{tensors}}}, "
            f"non_tensor={list(self.non_tensor)}, meta_info={list(self.meta_info)})"
        )

    def to(self: Self, device: str | torch.device) -> Self:
        return self._new(self.batch.to(device), dict(self.non_tensor), copy.copy(self.meta_info))

    # ---------------------------------------------------------------- columns
    def select(
        self: Self, batch_keys: Keys = None, non_tensor_keys: Keys = None, meta_info_keys: Keys = None
    ) -> Self:
        """Keep only the named keys (None keeps all of that part); absent meta_info keys are skipped.

        The result shares storage with self: its tensors and object arrays are self's, so an in-place
        edit (``out.batch["x"][0] = 1``, ``out.non_tensor["k"][0] = v``) changes self too; meta_info is
        copied. Use ``clone()`` (or ``select(...).clone()``) for an independent copy.
        """
        tensor_keys, nt_keys = args.key_list(batch_keys), args.key_list(non_tensor_keys)
        args.check_keys(self, "select", tensor_keys, nt_keys, [])
        batch = self.batch.select(*tensor_keys) if batch_keys is not None else self.batch.clone(recurse=False)
        nt_keys = nt_keys if non_tensor_keys is not None else list(self.non_tensor)
        meta_keys = args.key_list(meta_info_keys) if meta_info_keys is not None else list(self.meta_info)
        meta = copy.deepcopy({k: self.meta_info[k] for k in meta_keys if k in self.meta_info})
        return self._new(batch, {k: self.non_tensor[k] for k in nt_keys}, meta)

    def pop(
        self: Self, batch_keys: Keys = None, non_tensor_keys: Keys = None, meta_info_keys: Keys = None
    ) -> Self:
        """In place: remove the named keys from self; returns them as a batch of the same B rows."""
        tensor_keys, nt_keys = args.key_list(batch_keys), args.key_list(non_tensor_keys)
        meta_keys = args.key_list(meta_info_keys)
        args.check_keys(self, "pop", tensor_keys, nt_keys, meta_keys)
        popped = self._new(
            self.batch.select(*tensor_keys),
            {k: self.non_tensor[k] for k in nt_keys},
            {k: self.meta_info[k] for k in meta_keys},
        )
        # new containers: batches that share the old ones (built by select or to) keep their keys
        self.batch = self.batch.exclude(*tensor_keys)
        self.non_tensor = {k: v for k, v in self.non_tensor.items() if k not in nt_keys}
        self.meta_info = {k: v for k, v in self.meta_info.items() if k not in meta_keys}
        return popped

    def rename(self: Self, old_keys: str | Sequence[str], new_keys: str | Sequence[str]) -> Self:
        """In place: rename tensor or non-tensor columns; returns self, so ``d = d.rename(...)`` works too."""
        old, new = args.key_list(old_keys), args.key_list(new_keys)
        if len(old) != len(new):
            raise ValueError(f"rename: {len(old)} old keys but {len(new)} new keys")
        args.check_keys(self, "rename", [k for k in old if k not in self.non_tensor], [], [])
        mapping = dict(zip(old, new))
        kept = [k for k in self.keys if k not in mapping]
        for key in new:
            if key in kept or new.count(key) > 1:
                raise ValueError(f"rename: a column named {key!r} already exists")
        self.batch = TensorDict(
            {mapping.get(k, k): v for k, v in self.batch.items()}, batch_size=self.batch.batch_size
        )
        self.non_tensor = {mapping.get(k, k): v for k, v in self.non_tensor.items()}
        return self

    def union(self: Self, other: DataProto) -> Self:
        """Columns and meta_info of both; a key in both must hold equal values (NaN == NaN)."""
        if len(self) != len(other):
            raise ValueError(f"union: this batch has {len(self)} rows but the other has {len(other)}")
        tensors = union_columns(dict(self.batch.items()), dict(other.batch.items()), "tensor")
        non_tensor = union_columns(self.non_tensor, other.non_tensor, "non_tensor")
        for key, value in other.meta_info.items():
            if key in self.meta_info and not values_equal(mine := self.meta_info[key], value):
                raise ConflictingValuesError(f"union: meta_info {key!r} differs: {mine!r} vs {value!r}")
        added = {k: v for k, v in other.meta_info.items() if k not in self.meta_info}
        meta = copy.deepcopy(self.meta_info | added)
        return self._new(TensorDict(tensors, batch_size=[len(self)]), non_tensor, meta)

    def clone(self: Self) -> Self:
        """A deep copy sharing nothing with self: tensors, object columns, their row objects, meta_info."""
        # one deepcopy (one memo): an object that two columns share is shared in the copy too
        non_tensor, meta = copy.deepcopy((self.non_tensor, self.meta_info))
        return self._new(self.batch.clone(), non_tensor, meta)

    # ---------------------------------------------------------------- reshape (see protocol/reshape.py)
    def fold_batch_dim(self: Self, new_batch_size: int) -> Self:
        """Every column (B, *) -> (new_batch_size, B // new_batch_size, *); views of self's storage."""
        batch, non_tensor = reshape.fold(self.batch, self.non_tensor, new_batch_size)
        return self._new(batch, non_tensor, copy.deepcopy(self.meta_info))

    def unfold_batch_dim(self: Self, batch_dims: int = 2) -> Self:
        """Inverse of fold_batch_dim: every column's first batch_dims dims become the rows (views)."""
        batch, non_tensor = reshape.unfold(self.batch, self.non_tensor, batch_dims)
        return self._new(batch, non_tensor, copy.deepcopy(self.meta_info))

    def unfold_column_chunks(self: Self, n_split: int, split_keys: Keys = None) -> Self:
        """Each row -> n_split rows: split keys' dim 1 cut into n_split chunks, other columns repeated."""
        batch, non_tensor = reshape.unfold_column_chunks(self.batch, self.non_tensor, n_split, split_keys)
        return self._new(batch, non_tensor, copy.deepcopy(self.meta_info))

    # ---------------------------------------------------------------- rows
    def select_idxs(self: Self, idxs: Index) -> Self:
        """Rows at the given positions (one int, an index array, or a bool mask of length B)."""
        positions = args.row_positions(idxs, len(self))
        batch = self.batch[torch.from_numpy(positions)]
        non_tensor = {k: v[positions] for k, v in self.non_tensor.items()}
        return self._new(batch, non_tensor, copy.deepcopy(self.meta_info))

    def reorder(self: Self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> Self:
        """In place: row i becomes old row indices[i] (a permutation); returns self."""
        moved = self.select_idxs(args.permutation(indices, len(self)))
        self.batch, self.non_tensor = moved.batch, moved.non_tensor
        return self

    def repeat(self: Self, n: int, interleave: bool = True) -> Self:
        """Each row n times: [a, a, b, b] with interleave, else [a, b, a, b]."""
        if n <= 0:
            raise ValueError(f"repeat needs n >= 1, got {n}")
        rows = np.arange(len(self))
        return self.select_idxs(np.repeat(rows, n) if interleave else np.tile(rows, n))

    def sample_level_repeat(self: Self, counts: Sequence[int] | np.ndarray | torch.Tensor) -> Self:
        """Row i counts[i] times in a row (0 drops it): sum(counts) rows."""
        return self.select_idxs(args.repeat_positions(counts, len(self)))

    def pad_to_multiple(self: Self, n: int) -> tuple[Self, int]:
        """Append copies of the first rows so that B is a multiple of n; returns (padded, pad_size).

        Padded rows are real copies: callers that train on them must mask them (unpad first).
        """
        if n <= 0:
            raise ValueError(f"pad_to_multiple needs n >= 1, got {n}")
        pad_size = (-len(self)) % n if len(self) else 0
        order = np.concatenate([np.arange(len(self)), np.arange(pad_size) % max(len(self), 1)])
        return self.select_idxs(order.astype(np.int64)), pad_size

    def unpad(self: Self, pad_size: int) -> Self:
        """Drop the last pad_size rows added by pad_to_multiple."""
        if pad_size < 0 or pad_size > len(self):
            raise ValueError(f"unpad: pad_size {pad_size} out of range for {len(self)} rows")
        return self.select_idxs(np.arange(len(self) - pad_size))

    # ---------------------------------------------------------------- pieces
    @classmethod
    def concat(cls, parts: Sequence[Self], *, global_keys: Iterable[str] | None = None) -> Self:
        """The rows of parts with the same columns, in order; meta_info merged (nothing dropped).

        ``global_keys``: meta_info keys gathered from every part even when they agree (ROLL's argument).
        """
        if not parts:
            raise ValueError("concat needs at least one DataProto")
        args.check_same_columns(parts)
        batch = (
            cast(TensorDict, torch.cat([p.batch for p in parts], dim=0))  # torch.cat of TensorDicts: one
            if parts[0].batch.keys()
            else TensorDict({}, batch_size=[sum(len(p) for p in parts)])
        )
        non_tensor = {k: np.concatenate([p.non_tensor[k] for p in parts]) for k in parts[0].non_tensor}
        meta = merge_meta_info([p.meta_info for p in parts], global_keys or ())
        return parts[0]._new(batch, non_tensor, meta)

    def split(self: Self, size: int | Sequence[int]) -> list[Self]:
        """Consecutive pieces of ``size`` rows (the last may be smaller), or of the listed sizes (sum B).

        An empty batch splits into one empty piece, so that ``concat(d.split(k))`` always gives d back.
        """
        bounds = np.cumsum([0, *args.split_sizes(size, len(self))])
        return [self.select_idxs(np.arange(start, stop)) for start, stop in zip(bounds[:-1], bounds[1:])]

    def chunk(self: Self, n: int) -> list[Self]:
        """n consecutive pieces whose sizes differ by at most one (the first ones are larger)."""
        if n <= 0:
            raise ValueError(f"chunk needs n >= 1, got {n}")
        base, extra = divmod(len(self), n)
        return self.split([base + (1 if i < extra else 0) for i in range(n)])

    def group_by(self: Self, keys: str | Sequence[str]) -> dict[Any, tuple[Self, np.ndarray]]:
        """{value: (rows with that value, their positions)}, sorted; a value is a tuple for a key list."""
        columns = args.group_columns(self, args.key_list(keys))
        groups = args.group_positions(columns, as_tuples=not isinstance(keys, str))
        return {value: (self.select_idxs(rows), rows) for value, rows in groups.items()}

    @classmethod
    def ungroup(cls, groups: Sequence[tuple[Self, np.ndarray]] | dict[Any, tuple[Self, np.ndarray]]) -> Self:
        """Inverse of group_by: put each group's rows back at their original positions."""
        parts = list(groups.values()) if isinstance(groups, dict) else list(groups)
        inverse = args.ungroup_order([(len(data), idx) for data, idx in parts])
        return cls.concat([data for data, _ in parts]).select_idxs(inverse)

    # ---------------------------------------------------------------- iteration
    def make_iterator(
        self: Self,
        mini_batch_size: int,
        epochs: int = 1,
        seed: int | None = None,
        shuffle: bool = False,
        drop_last: bool = False,
    ) -> Iterator[Self]:
        """Mini-batches of mini_batch_size rows, every row once per epoch (the last may be smaller).

        With shuffle, each epoch takes a new order from one generator seeded once with ``seed``: the
        epochs differ, and the whole sequence repeats for the same seed.
        """
        for positions in args.minibatch_positions(
            len(self), mini_batch_size, epochs, seed, shuffle, drop_last
        ):
            yield self.select_idxs(positions)

    def iter_minibatches(
        self: Self, batch_size: int, shuffle: bool = False, seed: int | None = None, drop_last: bool = False
    ) -> Iterator[Self]:
        """One epoch of make_iterator."""
        return self.make_iterator(batch_size, 1, seed=seed, shuffle=shuffle, drop_last=drop_last)
