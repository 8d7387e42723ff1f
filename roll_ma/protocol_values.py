"""When do two values a DataProto carries agree, and how concat merges the parts' ``meta_info``.

One job: the comparison behind ``DataProto.union`` (a shared key must hold equal values) and the
merge behind ``DataProto.concat`` (what happens to a meta_info key the parts disagree on).

Equal means deep equality with NaN == NaN, so a batch equals its own pickled or Ray round-tripped
copy even when a log-prob or a metric is NaN. Tensors and numpy arrays must agree in shape and
dtype too; object arrays, dicts, lists and tuples are compared element by element.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["METRICS_KEY", "merge_meta_info", "values_equal"]

METRICS_KEY = "metrics"


def values_equal(a: Any, b: Any) -> bool:
    """Deep equality where NaN equals NaN (tensors, numpy arrays, dicts, lists, tuples, scalars)."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and _tensors_equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and _arrays_equal(a, b)
    if isinstance(a, dict) or isinstance(b, dict):
        return (
            isinstance(a, dict)
            and isinstance(b, dict)
            and a.keys() == b.keys()
            and all(values_equal(a[k], b[k]) for k in a)
        )
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(values_equal(x, y) for x, y in zip(a, b))
    if _is_nan(a) and _is_nan(b):
        return True
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # an object whose == is not a truth value counts as different
        return False


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


def _arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == object:  # rows may hold lists or arrays: == per element would be ambiguous
        return all(values_equal(x, y) for x, y in zip(a.flat, b.flat))
    return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))


def merge_meta_info(metas: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The meta_info of the concatenation of parts whose meta_info are ``metas`` (nothing is dropped).

    Every key of any part, in order of first appearance:

    - the parts that carry it all hold equal values (NaN == NaN): the value, once;
    - otherwise: a list with one entry per part, in part order (None where a part lacks the key).

    ``metrics`` (a dict ``name -> number`` that each worker reports) merges name by name: a name's
    value is kept once when every part that reports it agrees, else it becomes the list of the
    reporting parts' values in part order. ``np.mean(value)`` reduces both forms.
    """
    keys = list(dict.fromkeys(k for meta in metas for k in meta))
    merged: dict[str, Any] = {}
    for key in keys:
        carried = [meta[key] for meta in metas if key in meta]
        if key == METRICS_KEY and all(isinstance(v, dict) for v in carried):
            merged[key] = _merge_metrics(carried)
        elif all(values_equal(carried[0], v) for v in carried[1:]):
            merged[key] = copy.deepcopy(carried[0])
        else:
            merged[key] = [copy.deepcopy(meta.get(key)) for meta in metas]
    return merged


def _merge_metrics(reports: list[dict[str, Any]]) -> dict[str, Any]:
    names = list(dict.fromkeys(name for report in reports for name in report))
    merged: dict[str, Any] = {}
    for name in names:
        values = [copy.deepcopy(report[name]) for report in reports if name in report]
        same = all(values_equal(values[0], v) for v in values[1:])
        merged[name] = values[0] if same else values
    return merged
