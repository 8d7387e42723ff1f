"""When do two values a DataProto carries agree, and how concat merges the parts' ``meta_info``.

One job: the comparison behind ``DataProto.union`` and ``union_tensor_dict`` / ``union_numpy_dict`` (a
shared key must hold equal values) and the merge behind ``DataProto.concat`` (what happens to a meta_info
key the parts disagree on).

Equal means deep equality with NaN == NaN, so a batch equals its own pickled or Ray round-tripped
copy even when a log-prob or a metric is NaN. Tensors and numpy arrays must agree in shape and
dtype too; object arrays, dicts, lists and tuples are compared element by element. Containers that
hold themselves (an object array whose element is the array) compare without endless recursion: the
same object is equal to itself, and a pair of containers met again below itself counts as equal there,
so two such structures are equal when they agree everywhere else.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

__all__ = [
    "METRICS_KEY",
    "ConflictingValuesError",
    "merge_meta_info",
    "union_numpy_dict",
    "union_tensor_dict",
    "values_equal",
]

METRICS_KEY = "metrics"


class ConflictingValuesError(ValueError, AssertionError):
    """A key that both sides of a union carry holds different values.

    A ValueError like every other DataProto error; also an AssertionError, because verl's union functions
    assert, so code written against verl that catches AssertionError keeps catching it.
    """


def values_equal(a: Any, b: Any) -> bool:
    """Deep equality where NaN equals NaN (tensors, numpy arrays, dicts, lists, tuples, scalars)."""
    return _equal(a, b, set())


def _equal(a: Any, b: Any, path: set[tuple[int, int]]) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and _tensors_equal(a, b)
    if isinstance(a, _CONTAINERS) or isinstance(b, _CONTAINERS):
        pair = (id(a), id(b))
        if pair in path:  # compared further up already: a cycle, equal unless something else differs
            return True
        path.add(pair)
        try:
            return _containers_equal(a, b, path)
        finally:
            path.discard(pair)
    if _is_nan(a) and _is_nan(b):
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # an object whose == is not a truth value counts as different
        return False


_CONTAINERS = (np.ndarray, dict, list, tuple)


def _containers_equal(a: Any, b: Any, path: set[tuple[int, int]]) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and _arrays_equal(a, b, path)
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict)
            and isinstance(b, dict)
            and a.keys() == b.keys()
            and all(_equal(a[k], b[k], path) for k in a)
        )
    return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y, path) for x, y in zip(a, b))


def _is_nan(x: Any) -> bool:
    return isinstance(x, (float, complex, np.floating, np.complexfloating)) and x != x


def _tensors_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    b = b.to(a.device)
    if torch.equal(a, b):
        return True
    if not (a.is_floating_point() or a.is_complex()):
        return False
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def _arrays_equal(a: np.ndarray, b: np.ndarray, path: set[tuple[int, int]]) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == object:  # rows may hold lists or arrays: == per element would be ambiguous
        return all(_equal(x, y, path) for x, y in zip(a.flat, b.flat))
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def union_columns(first: dict[str, Any], second: dict[str, Any], what: str) -> dict[str, Any]:
    """A new dict with the keys of both; a key in both must hold equal values (else the error names it)."""
    merged = dict(first)
    for key, value in second.items():
        if key in merged and not values_equal(merged[key], value):
            raise ConflictingValuesError(f"union: {what} {key!r} is in both batches with different values")
        merged.setdefault(key, value)
    return merged


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """In place, like verl: adds tensor_dict2's keys to tensor_dict1 and returns it; a key in both must hold
    equal tensors (NaN == NaN). ``DataProto.union`` is the form that leaves both sides as they were."""
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise ValueError(
            f"union_tensor_dict: batch sizes differ: {list(tensor_dict1.batch_size)} vs "
            f"{list(tensor_dict2.batch_size)}"
        )
    for key, value in tensor_dict2.items():
        if key not in tensor_dict1.keys():
            tensor_dict1[key] = value
        elif not values_equal(tensor_dict1[key], value):
            raise ConflictingValuesError(f"union_tensor_dict: {key!r} differs between the two TensorDicts")
    return tensor_dict1


def union_numpy_dict(
    tensor_dict1: dict[str, np.ndarray], tensor_dict2: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """In place, like verl: adds tensor_dict2's arrays to tensor_dict1 and returns it; a key in both must hold
    equal arrays (NaN == NaN, object arrays element by element, self-containing arrays allowed)."""
    for key, value in tensor_dict2.items():
        if key in tensor_dict1:
            for name, arr in (("tensor_dict1", tensor_dict1[key]), ("tensor_dict2", value)):
                if not isinstance(arr, np.ndarray):
                    raise ValueError(
                        f"union_numpy_dict: {name}[{key!r}] is a {type(arr).__name__}, not an array"
                    )
            if not values_equal(tensor_dict1[key], value):
                # the first sentence is verl's, so that code matching verl's message keeps matching
                raise ConflictingValuesError(
                    f"`{key}` in tensor_dict1 and tensor_dict2 are not the same object. (union_numpy_dict: "
                    "their values differ; NaN counts as equal to NaN)"
                )
        tensor_dict1[key] = value
    return tensor_dict1


def merge_meta_info(metas: Sequence[dict[str, Any]], global_keys: Iterable[str] = ()) -> dict[str, Any]:
    """The meta_info of the concatenation of parts whose meta_info are ``metas`` (nothing is dropped).

    Every key of any part, in order of first appearance:

    - the parts that carry it all hold equal values (NaN == NaN): the value, once;
    - otherwise: a list with one entry per part, in part order (None where a part lacks the key).

    ``metrics`` holds reports: each part's value is a dict ``name -> value`` or a list of such dicts (one
    per report, as verl's workers send them). It merges name by name: a name's value is kept once when
    every report of it agrees, else it becomes the list of the reported values in order, where a value
    that is a list, tuple or array adds its elements (a worker that reports one number per micro-batch).
    ``np.mean(value)`` reduces both forms to the mean of every reported number.

    ``global_keys`` (ROLL's argument) are gathered even when the parts agree: a list with one entry per
    part, or for dict values, name by name the list of every reported value (elements added as above).
    Pass ``global_keys={"metrics"}`` where a metric is summed, so that equal reports are not kept once.
    """
    gathered = set(global_keys)
    keys = list(dict.fromkeys(k for meta in metas for k in meta))
    merged: dict[str, Any] = {}
    for key in keys:
        carried = [meta[key] for meta in metas if key in meta]
        reports = _reports(carried) if key == METRICS_KEY or key in gathered else None
        if reports is not None:
            merged[key] = _merge_reports(reports, always_list=key in gathered)
        elif key not in gathered and all(values_equal(carried[0], v) for v in carried[1:]):
            merged[key] = copy.deepcopy(carried[0])
        else:
            merged[key] = [copy.deepcopy(meta.get(key)) for meta in metas]
    return merged


def _reports(carried: list[Any]) -> list[dict[str, Any]] | None:
    """The dicts that the parts' values hold (a dict each, or a non-empty list of dicts), else None."""
    reports: list[dict[str, Any]] = []
    for value in carried:
        if isinstance(value, dict):
            reports.append(value)
        elif isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
            reports.extend(value)
        else:
            return None
    return reports


def _merge_reports(reports: list[dict[str, Any]], always_list: bool) -> dict[str, Any]:
    names = list(dict.fromkeys(name for report in reports for name in report))
    merged: dict[str, Any] = {}
    for name in names:
        values = [report[name] for report in reports if name in report]
        if not always_list and all(values_equal(values[0], v) for v in values[1:]):
            merged[name] = copy.deepcopy(values[0])
        else:
            merged[name] = [copy.deepcopy(x) for v in values for x in _elements(v)]
    return merged


def _elements(value: Any) -> list[Any]:
    """A reported value as the numbers it holds: a list, tuple or array adds its elements."""
    if isinstance(value, np.ndarray) and value.ndim >= 1:
        return value.reshape(-1).tolist()
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]
