"""Turn a plain dict (from yaml) into the typed dataclasses, collecting every problem.

Nothing here raises on the first bad key: each problem is recorded with its full key path
and a fix, so that the user sees all of them at once.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Literal, Union

# the config errors live with the others (roll_ma/errors.py); kept importable from here
from roll_ma.errors import ConfigError as ConfigError
from roll_ma.errors import ConfigProblem as ConfigProblem


def suggest(word: str, options: typing.Iterable[str]) -> str:
    """' (did you mean X?)' for the closest option, or ''."""
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _as_written(choice: Any) -> str:
    """A Literal's choice as a YAML file or an override writes it: true / false, 1, 'kv_cache'."""
    return str(choice).lower() if isinstance(choice, bool) else repr(choice)


def is_choice(value: Any, choices: tuple) -> bool:
    """``value`` is one of ``choices``, of the same type: 0 and 1 are not false and true (Python's 0 == False
    would let ``share_prompt_prefix=0`` through as neither), and a quoted '1' is not the number 1."""
    return any(value == c and type(value) is type(c) for c in choices)


def literal_problem(value: Any, choices: tuple) -> str:
    """Why ``value`` is none of ``choices``, with the choice it most likely meant."""
    shown = ", ".join(_as_written(c) for c in choices)
    written = [_as_written(c).strip("'") for c in choices]  # unquoted: what a user typed to mean each
    meant = [c for c, w in zip(choices, written) if w.lower() == str(value).lower()]  # "1" for 1, TRUE: true
    if not meant and type(value) is int and value in (0, 1) and any(isinstance(c, bool) for c in choices):
        meant = [bool(value)]
    hint = f" (did you mean {_as_written(meant[0])}?)" if meant else suggest(value, written)
    return f"must be one of {shown}, got {value!r}{hint}"


def _refused_why(meta: dict[str, Any], value: Any) -> str | None:
    """The field's reason for leaving ``value`` out of its choices (``refused``: {value: why}), matched with
    its type as a choice is (true is not 1)."""
    for refused, why in meta.get("refused", {}).items():
        if type(refused) is type(value) and refused == value:
            return why
    return None


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        return f"list of {_type_name(inner)}"
    if origin is dict:
        return "mapping"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


class _Converter:
    def __init__(self, all_paths: dict[str, list[str]], moved: dict[str, str]):
        self.problems: list[ConfigProblem] = []
        # leaf name -> full paths where it exists, for "did you mean train.lr?" across sections
        self.all_paths = all_paths
        self.moved = moved  # old key path -> new key path

    def fail(self, key: str, message: str) -> None:
        self.problems.append(ConfigProblem(key, message))

    def convert(self, tp: Any, value: Any, key: str, meta: dict[str, Any]) -> Any:
        origin = typing.get_origin(tp)
        if tp is Any:
            return value
        if origin in (Union, types.UnionType):
            args = typing.get_args(tp)
            if value is None and type(None) in args:
                return None
            non_none = [a for a in args if a is not type(None)]
            if len(non_none) == 1:
                return self.convert(non_none[0], value, key, meta)
            return value
        if value is None:
            self.fail(key, f"must be {_type_name(tp)}, got null")
            return None
        if origin is Literal:
            choices = typing.get_args(tp)
            if not is_choice(value, choices):
                why = _refused_why(meta, value)
                self.fail(key, literal_problem(value, choices) + (f": {why}" if why else ""))
            return value
        if dataclasses.is_dataclass(tp):
            return self.dataclass(tp, value, key)
        if origin is list:
            (inner,) = typing.get_args(tp) or (Any,)
            if not isinstance(value, (list, tuple)):
                self.fail(key, f"must be {_type_name(tp)}, got {type(value).__name__} {value!r}")
                return []
            return [self.convert(inner, v, f"{key}[{i}]", {}) for i, v in enumerate(value)]
        if origin is dict:
            if not isinstance(value, dict):
                self.fail(key, f"must be a mapping, got {type(value).__name__} {value!r}")
                return {}
            _, inner = typing.get_args(tp) or (str, Any)
            return {k: self.convert(inner, v, f"{key}.{k}", {}) for k, v in value.items()}
        if tp is bool:
            if not isinstance(value, bool):
                self.fail(key, f"must be true or false, got {value!r}")
            return value
        if tp is int:
            if isinstance(value, bool) or not isinstance(value, int):
                if isinstance(value, float) and value.is_integer():
                    value = int(value)
                else:
                    self.fail(key, f"must be an integer, got {type(value).__name__} {value!r}")
                    return value
            return self._check_range(key, value, meta)
        if tp is float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                self.fail(key, f"must be a number, got {type(value).__name__} {value!r}")
                return value
            return self._check_range(key, float(value), meta)
        if tp is str:
            if isinstance(value, (dict, list)):
                self.fail(key, f"must be a string, got {type(value).__name__}")
                return value
            return str(value)
        return value

    def _check_range(self, key: str, value: float, meta: dict[str, Any]) -> Any:
        lo, hi = meta.get("min"), meta.get("max")
        if lo is not None and value < lo:
            why = meta.get("min_why")
            self.fail(key, f"{why} (got {value})" if why else f"must be >= {lo}, got {value}")
        if hi is not None and value > hi:
            why = meta.get("max_why")
            self.fail(key, f"{why} (got {value})" if why else f"must be <= {hi}, got {value}")
        return value

    def dataclass(self, cls: Any, raw: Any, prefix: str) -> Any:
        if not isinstance(raw, dict):
            self.fail(prefix, f"must be a mapping of {cls.__name__} fields, got {type(raw).__name__} {raw!r}")
            return cls()
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {}
        for name, value in raw.items():
            key = f"{prefix}.{name}" if prefix else str(name)
            if name not in fields and key in self.moved:
                new = self.moved[key]
                section, leaf = new.rsplit(".", 1)
                self.fail(key, f"moved to {new}: put {leaf} under `{section}:` in the yaml, or override "
                               f"{new}=... on the command line")
                continue
            if name not in fields:
                self.fail(key, "unknown key" + self._unknown_hint(str(name), fields, prefix))
                continue
            kwargs[name] = self.convert(hints[name], value, key, dict(fields[name].metadata))
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as err:  # a type problem already reported makes the object invalid
            self.fail(prefix, str(err))
            return cls()

    def _unknown_hint(self, name: str, fields: dict[str, Any], prefix: str) -> str:
        hint = suggest(name, fields)
        if hint:
            return hint
        elsewhere = [p for p in self.all_paths.get(name, []) if p.rsplit(".", 1)[0] != prefix]
        if elsewhere:
            return f" (did you mean {elsewhere[0]!r}?)"
        return f"; valid keys here: {', '.join(sorted(fields))}"


def _leaf_paths(cls: Any, prefix: str = "") -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}.{f.name}" if prefix else f.name
        out.setdefault(f.name, []).append(path)
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            for leaf, paths in _leaf_paths(tp, path).items():
                out.setdefault(leaf, []).extend(paths)
    return out


def to_dataclass(
    cls: Any, raw: dict[str, Any], moved: dict[str, str] | None = None
) -> tuple[Any, list[ConfigProblem]]:
    """Build ``cls`` from ``raw``; returns (object, problems). The object is only usable if no problems.

    ``moved``: old key path -> new key path, for keys that left a section (reported as moved, not unknown).
    """
    conv = _Converter(_leaf_paths(cls), moved or {})
    obj = conv.dataclass(cls, raw, "")
    return obj, conv.problems


def describe(cls: Any, prefix: str = "", defaults: Any = None) -> list[tuple[str, str, Any, str]]:
    """(key, type, default, help) of every leaf field, for --help and the docs.

    ``defaults``: the instance whose values are the defaults (a nested block's default factory may set
    other values than its class, e.g. an empty teacher.model.path)."""
    rows = []
    hints = typing.get_type_hints(cls)
    defaults = defaults if defaults is not None else cls()
    for f in dataclasses.fields(cls):
        path = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        default = getattr(defaults, f.name)
        if dataclasses.is_dataclass(tp):
            rows.extend(describe(tp, path, default))
            continue
        rows.append((path, _type_name(tp), default, f.metadata.get("help", "")))
    return rows
