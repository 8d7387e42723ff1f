"""Plug points by name: one registry idiom for estimators, losses, envs, tools and backends.

A config names the implementation of a plug point with one string, in one of three spellings:

- a built-in or registered name: ``grpo``, ``tiny_hanabi``, ``python``;
- an importable object: ``my_pkg.losses:my_loss`` (or ``my_pkg.losses.my_loss``);
- a file: ``path/to/losses.py:my_loss`` (relative: from the current directory, then the roll_ma checkout;
  a run makes it absolute before any actor starts, ``workflows.lookup.with_absolute_files``).

Every process that uses the plug point resolves the same string itself with ``Registry.get``: the driver
when it validates the config, each Ray worker when it calls the object. A spec therefore reaches every
worker; a name added with a ``register`` decorator is known only in processes that imported the module
holding the decorator (the built-ins are listed as import paths, imported on first use, so every
process knows them).

This module imports nothing of roll_ma above it, and nothing heavy: the config's checks read it cheaply.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
import sys
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

REPO_ROOT = Path(__file__).resolve().parents[1]
SPELLINGS = "'pkg.module:name' or 'path/to/file.py:name'"

T = TypeVar("T")


class Registry(Generic[T]):
    """The implementations of one plug point, by name or spec; ``get`` resolves any of the three spellings.

    Args:
        kind: what one implementation is, for messages ("policy loss").
        config_key: the config key that names one ("algorithm.policy_loss").
        register_with: the decorator that registers a name (for messages).
        also: names the config accepts that the caller handles before the lookup (they resolve to nothing).
        builtins: name -> 'pkg.module:attr' of the built-ins, imported on first use.
        check: why an object is not an implementation of this kind (None: it is); run on every resolved
            object, so that a spec naming the wrong thing fails where it is resolved, in the config's words.
    """

    def __init__(self, kind: str, config_key: str, register_with: str, also: tuple[str, ...] = (), *,
                 builtins: Mapping[str, str] | None = None, check: Callable[[Any], str | None] | None = None):
        self.kind, self.config_key, self.register_with = kind, config_key, register_with
        self.also = also
        self.builtins = dict(builtins or {})
        self.check = check
        self._registered: dict[str, T] = {}

    def register(self, name: str) -> Callable[[Any], Any]:
        """Decorator: register an object under ``name``; the same object twice (a module imported again) is
        fine, another one under a taken name is a ValueError, one of the wrong kind a TypeError."""

        def add(obj: Any) -> Any:
            taken = name in self.builtins or name in self.also
            if taken or self._registered.get(name, obj) is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered; pick another name")
            why = self.check(obj) if self.check else None
            if why:
                raise TypeError(f"{self.register_with}({name!r}) needs a {self.kind}: {obj!r} {why}")
            self._registered[name] = obj
            return obj

        return add

    def names(self) -> tuple[str, ...]:
        """Every name this process knows: the built-ins, ``also`` and the registered ones, sorted."""
        return tuple(sorted({*self.builtins, *self.also, *self._registered}))

    def get(self, spec: str) -> T:
        """The object ``spec`` names (module docstring); ValueError naming ``config_key`` and the fix when
        it names nothing, or something of another kind. Importing a user's module may raise anything."""
        if spec in self._registered:
            return self._registered[spec]
        if spec in self.also:
            raise ValueError(f"{self.config_key}={spec!r} is handled before the lookup")
        source = self.builtins.get(spec, spec)
        if not is_spec(source):
            raise ValueError(f"{self.config_key}={spec!r}: {self._unknown_name(spec)}")
        try:
            module, obj = load_target(source)
        except ValueError as err:
            raise ValueError(f"{self.config_key}={spec!r}: {err}") from err
        why = self.check(obj) if self.check else None
        if why:
            name = source.rpartition(":")[2] if ":" in source else source.rpartition(".")[2]
            raise ValueError(f"{self.config_key}={spec!r}: {name} in "
                             f"{module_location(module)} is no {self.kind}: it {why}")
        return obj

    def unknown(self, spec: str) -> str | None:
        """Why ``spec`` does not resolve, in the config's words (None: it does, or it is one of ``also``);
        a failing import of a user's module is reported, not raised."""
        if spec in self.also:
            return None
        try:
            self.get(spec)
        except ValueError as err:
            return str(err).removeprefix(f"{self.config_key}={spec!r}: ")
        except Exception as err:  # noqa: BLE001 - importing the user's module ran its code
            return f"importing {spec!r} failed: {type(err).__name__}: {err}"
        return None

    def _unknown_name(self, name: str) -> str:
        close = difflib.get_close_matches(name, self.names(), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return (f"no {self.kind} is named {name!r}{hint}; registered: {', '.join(self.names())}. Name your "
                f"own as {SPELLINGS}, or register a name with {self.register_with} in a module every "
                "process that uses it imports")


class StudyPlugs(Generic[T]):
    """What a study adds to the core by name (an RL step kind, a PPO loss term, advantage weights): the core
    imports no study; ``roll_ma.studies`` registers its plugs when imported, and the core looks up the name
    its run plan gives. A process that never imported the studies is told so by the setting that asked."""

    def __init__(self, kind: str):
        self.kind = kind
        self._by_name: dict[str, T] = {}

    def register(self, name: str, obj: T) -> None:
        """Add ``obj`` as ``name``; the same object twice (a module imported again) is fine."""
        if self._by_name.get(name, obj) is not obj:
            raise ValueError(f"the {self.kind} {name!r} is registered already")
        self._by_name[name] = obj

    def get(self, name: str, setting: str) -> T:
        """The plug ``name``, which ``setting`` (the config's words) asked for."""
        if name not in self._by_name:
            raise ValueError(f"{setting}: the {self.kind} {name!r} is a study's (roll_ma.studies), not "
                             "loaded in this process; import roll_ma.studies before the run starts "
                             "(roll_ma.train and start_pipeline.py do)")
        return self._by_name[name]


def takes_positional(*args: str) -> Callable[[Any], str | None]:
    """A ``Registry`` check: the object is a function roll_ma can call with the positional ``args``."""

    def check(obj: Any) -> str | None:
        if not callable(obj) or inspect.isclass(obj):
            return f"is {_a(type(obj).__name__)}, not a function"
        try:
            inspect.signature(obj).bind(*([None] * len(args)))
        except TypeError as err:
            return f"must take ({', '.join(args)}), roll_ma's call failed: {err}"
        except ValueError:
            return None  # a builtin without a readable signature: nothing to refuse
        return None

    return check


def subclass_of(base: type) -> Callable[[Any], str | None]:
    """A ``Registry`` check: the object is a subclass of ``base``."""

    def check(obj: Any) -> str | None:
        if inspect.isclass(obj) and issubclass(obj, base):
            return None
        return f"is not a {base.__name__} subclass"

    return check


def implements(protocol_spec: str) -> Callable[[Any], str | None]:
    """A ``Registry`` check: the object is a class with every method the ``typing.Protocol`` named by
    ``protocol_spec`` ('pkg.module:Name') declares. The protocol is imported at the first check, not when
    the registry is built (backend protocols import the DataProto, and with it torch)."""
    module_name, _, name = protocol_spec.partition(":")

    def check(obj: Any) -> str | None:
        if not inspect.isclass(obj):
            return f"is {_a(type(obj).__name__)}, not a class"
        protocol = getattr(importlib.import_module(module_name), name)
        missing = [n for n in protocol_methods(protocol) if not callable(getattr(obj, n, None))]
        where = module_name.replace(".", "/") + ".py"
        return f"lacks {', '.join(missing)} of {name} ({where})" if missing else None

    return check


def protocol_methods(protocol: type) -> list[str]:
    """The public methods a ``typing.Protocol`` declares, its Protocol bases' included."""
    names: set[str] = set()
    for base in protocol.__mro__:
        if base.__module__ not in ("typing", "builtins"):
            names |= {n for n, v in vars(base).items() if not n.startswith("_") and callable(v)}
    return sorted(names)


def is_class(obj: Any) -> str | None:
    """A ``Registry`` check: the object is a class."""
    return None if inspect.isclass(obj) else f"is a {type(obj).__name__}, not a class"


# ---- the spellings: names, modules and files ------------------------------------------------------


def is_spec(value: str) -> bool:
    """Whether ``value`` names a module's object ('pkg.module:name', 'pkg.module.name', 'file.py:name')
    rather than a plain registered name."""
    return ":" in value or "." in value


def split_file_spec(spec: str) -> tuple[str | None, str]:
    """('path/to/file.py', 'Name') for a file spec, else (None, spec)."""
    head, sep, attr = spec.rpartition(":")
    if sep and head.endswith(".py"):
        return head, attr
    return None, spec


def absolute_spec(spec: str) -> str:
    """``spec`` with a relative file path made absolute (Ray actors may run in another directory)."""
    path, attr = split_file_spec(spec)
    return f"{find_file(path)}:{attr}" if path is not None else spec


def import_target(spec: str) -> tuple[Any, str]:
    """(module, name) of what ``spec`` names: 'path/to/file.py:Name' (the file found by ``find_file``),
    'pkg.module:Name' or 'pkg.module.Name'. ValueError, without the caller's context, when the spelling
    is wrong, the file is missing or the import fails; whether the module has the name is the caller's."""
    path, attr = split_file_spec(spec)
    if path is not None:
        return import_file(find_file(path)), attr
    module_name, _, attr = spec.partition(":") if ":" in spec else spec.rpartition(".")
    if not module_name or not attr:
        raise ValueError(f"use {SPELLINGS}")
    try:
        return importlib.import_module(module_name), attr
    except ImportError as err:
        raise ValueError(f"cannot import {module_name!r} ({err}); install it, put its folder on PYTHONPATH, "
                         "or name the file as 'path/to/file.py:Name'") from err


def load_target(spec: str) -> tuple[Any, Any]:
    """(module, object) of what ``spec`` names (spellings as ``import_target``); ValueError, without the
    caller's context, also when the module has no such name (naming the closest one it has)."""
    module, attr = import_target(spec)
    target = getattr(module, attr, None)
    if target is None:
        public = defined_names(module)
        close = difflib.get_close_matches(attr, public, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{module_location(module)} has no {attr!r}{hint}; it defines {public}")
    return module, target


def defined_names(module: Any) -> list[str]:
    """The public functions and classes ``module`` itself defines (not those it imports)."""
    return sorted(n for n, v in vars(module).items() if not n.startswith("_") and callable(v)
                  and getattr(v, "__module__", module.__name__) == module.__name__)


def _a(noun: str) -> str:
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


def module_location(module: Any) -> str:
    """A module's file, or its name when it has none (for messages)."""
    return getattr(module, "__file__", None) or module.__name__


def names_a_file(source: str) -> bool:
    """Whether a module ``source`` is a file ('path/to/file.py') rather than a dotted module name."""
    return source.endswith(".py") or "/" in source


def import_source(source: str) -> Any:
    """The module ``source`` names: a file 'path/to/file.py' (found by ``find_file``) or an importable
    dotted module; ValueError when neither loads."""
    if names_a_file(source):
        return import_file(find_file(source))
    try:
        return importlib.import_module(source)
    except ImportError as err:
        raise ValueError(f"cannot import {source!r} ({err}); give 'path/to/file.py' or an importable "
                         "module") from err


def find_file(path: str) -> str:
    """The absolute path of ``path``: as given, else from the current directory, then the roll_ma checkout."""
    candidates = [Path(path).expanduser()]
    if not candidates[0].is_absolute():
        candidates = [Path.cwd() / path, REPO_ROOT / path]
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate.resolve())
    places = list(dict.fromkeys(str(c.parent) for c in candidates))
    raise ValueError(
        f"no file {path!r} (looked in {', '.join(places)}); give an absolute path or one relative to "
        "where you start the run"
    )


def import_file(file: str) -> Any:
    """The module of a Python file (imported once per path and process)."""
    # why a name derived from the path: two user files named flows.py must not replace each other
    name = f"roll_ma_user_{Path(file).stem}_{zlib.crc32(file.encode()):08x}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, file)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"{file} is not an importable Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # why: dataclasses and pickling look modules up by name
    try:
        module_spec.loader.exec_module(module)
    except Exception:
        del sys.modules[name]
        raise
    return module
