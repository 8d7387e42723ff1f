"""Refusal messages in the user's words: a check of every ``ConfigError`` and ``PreflightError`` message.

A message may name config keys (``env.seats``, ``agents[2].kind``: the paths of roll_ma/config/schema.py),
``file:line`` and what the user wrote (a value or key of their config, an agent name, a column or name in a
file the message names), environment variables and file names. An identifier-looking token that is none of
those (``snake_case`` with an underscore, ``something[...]``, or ``a.b`` dotted) is a word from inside the
code (``role_kinds['fixer']``, ``seat_agents``) and fails the test that raised the message.

``RefusalWords`` records, while a test runs, the raw configs it builds, the configs it pre-flights and every
refusal message; ``problems()`` lists each word of a message that the user could not have known.
tests/conftest.py applies it to the validation and pre-flight suites (``MESSAGE_SUITES``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
import types
import typing
from pathlib import Path
from typing import Any

# the test modules whose refusal messages are checked: the validation and pre-flight suites
MESSAGE_SUITES = {
    "test_cli", "test_config", "test_example_configs", "test_phase_config", "test_placement",
    "test_preflight_data", "test_preflight_model_source", "test_preflight_probes", "test_preflight_resume",
    "test_workflow_config", "test_message_words", "test_compose_errors", "test_preflight_output_dir",
    "test_cli_mistakes",
}
# names from outside the config that a message may use, each one the user meets in their own model, their
# own code or English
OUTSIDE_NAMES = {
    "max_position_embeddings", "vocab_size", "model_type",  # the model's config.json
    "eos_token", "chat_template", "pad_token",  # the tokenizer's settings
    "roll_ma.train",  # the function a Python user called
    "e.g", "i.e",
}
FILE_SUFFIXES = (".json", ".jsonl", ".jinja", ".yaml", ".yml", ".py", ".txt", ".parquet", ".safetensors",
                 ".bin", ".pt", ".pth", ".gguf", ".model", ".log", ".md", ".sh")
TOKEN = re.compile(r"(?<![\w\-])(--|\*)?([A-Za-z_]\w*(?:\.[A-Za-z_]\w*|\[[^\]\s]*\])*)")
PART = re.compile(r"[A-Za-z_]\w*")


def key_paths() -> tuple[set[str], set[str], set[str]]:
    """(every key path and section of the schema, the open mappings whose keys are the user's, the words of
    the schema's help texts: what docs/configuration.md shows)."""
    from roll_ma.config.schema import RunConfig

    paths: set[str] = set()
    open_keys: set[str] = set()
    help_words: set[str] = set()

    def walk(cls: Any, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            path = f"{prefix}.{f.name}" if prefix else f.name
            paths.add(path)
            help_words.update(PART.findall(f.metadata.get("help", "")))
            tp = _unwrap(hints[f.name])
            if dataclasses.is_dataclass(tp):
                walk(tp, path)
            elif typing.get_origin(tp) is dict or tp is Any:
                open_keys.add(path)

    walk(RunConfig, "")
    return paths, open_keys, help_words


def _unwrap(tp: Any) -> Any:
    """X from X | None and list[X]."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _unwrap(args[0]) if len(args) == 1 else tp
    if origin is list:
        (inner,) = typing.get_args(tp) or (Any,)
        return _unwrap(inner) if dataclasses.is_dataclass(inner) else tp
    return tp


def words_of(value: Any) -> set[str]:
    """The identifier parts of every string, key and value in ``value`` (a raw config, a dataclass)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    out: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            out |= words_of(k) | words_of(v)
    elif isinstance(value, (list, tuple, set)):
        for v in value:
            out |= words_of(v)
    elif isinstance(value, str):
        out.update(PART.findall(value))
    return out


def words_of_files_named(message: str) -> set[str]:
    """What the user can see of each path the message names: a (small) file's text, the names in a folder
    and its subfolders (a checkpoint's step_000004 under trainer.output_dir)."""
    out: set[str] = set()
    for chunk in message.split():
        chunk = re.sub(r"(:\d+)?[:;,.)]*$", "", chunk.strip("(`'\"").rsplit("=", 1)[-1])
        path = Path(chunk)
        if "/" not in chunk or not path.exists():
            continue
        if path.is_file() and path.stat().st_size < 2_000_000:
            out.update(PART.findall(path.read_text(errors="replace")))
        elif path.is_dir():
            for sub in [path, *[p for p in path.iterdir() if p.is_dir()]]:
                out.update(PART.findall(" ".join(p.name for p in sub.iterdir())))
    return out


class RefusalWords:
    """What one test's refusal messages say, and what its user wrote."""

    def __init__(self) -> None:
        self.paths, self.open_keys, self.help_words = key_paths()
        self.user_words: set[str] = set()
        self.messages: list[str] = []
        self.flags = _cli_flags()
        self.config_names = set(_config_names())

    def install(self, monkeypatch: Any) -> None:
        """Record the configs built and pre-flighted, and every ConfigError / PreflightError message."""
        from roll_ma.config import compose as loading
        from roll_ma.config.typed import ConfigError
        from roll_ma.errors import PreflightError
        from roll_ma.preflight import config_loader, data_files

        def config_error(self_: Any, problems: list) -> None:
            self.messages.extend(str(p) for p in problems)
            original_config_error(self_, problems)

        def preflight_error(self_: Any, problems: list, *rest: Any, **kwargs: Any) -> None:
            self.messages.extend(str(p) for p in problems)
            original_preflight_error(self_, problems, *rest, **kwargs)

        def build_config(raw: dict, *args: Any, **kwargs: Any) -> Any:
            self.user_words.update(words_of(raw))
            cfg = original_build_config(raw, *args, **kwargs)
            self.user_words.update(words_of(cfg))  # its defaults too: a checkpoint may show them
            return cfg

        def find_config(name: str, *args: Any, **kwargs: Any) -> Any:  # the --config_name the user typed
            self.user_words.update(words_of(name))
            return original_find_config(name, *args, **kwargs)

        def chat_files(cfg: Any) -> Any:  # every pre-flighted config passes here
            self.user_words.update(words_of(cfg))
            return original_chat_files(cfg)

        original_config_error, original_preflight_error = ConfigError.__init__, PreflightError.__init__
        original_build_config, original_chat_files = config_loader.build_config, data_files.chat_files
        original_find_config = loading.find_config
        monkeypatch.setattr(loading, "find_config", find_config)
        monkeypatch.setattr(ConfigError, "__init__", config_error)
        monkeypatch.setattr(PreflightError, "__init__", preflight_error)
        monkeypatch.setattr(config_loader, "build_config", build_config)
        monkeypatch.setattr(data_files, "chat_files", chat_files)

    def problems(self) -> list[str]:
        """``message: word`` for each word of a recorded message the user could not have known."""
        out = []
        for message in dict.fromkeys(self.messages):
            out.extend(f"{word!r} in: {message}" for word in self.inside_words(message))
        return out

    def inside_words(self, message: str) -> list[str]:
        """The words of ``message`` that are neither config keys nor the user's nor outside names."""
        text = " ".join(w for w in message.split() if "/" not in w and "\\" not in w)  # paths, URLs
        user = self.user_words | words_of_files_named(message)
        tokens = [(dashes, tok) for dashes, tok in TOKEN.findall(text)
                  if "_" in tok or "[" in tok or "." in tok]
        # the sections of the keys the message names (``trainer`` of ``trainer.nope``): their leaves may be
        # named alone (``valid keys here: keep_last, ...``)
        sections = {tok.rsplit(".", 1)[0] for _, tok in tokens if "." in self._path(tok)}
        bad = []
        for prefix, tok in tokens:
            if prefix == "--":
                ok = tok in self.flags
            else:
                glob = prefix == "*" and any(fnmatch.fnmatch(n, "*" + tok) for n in self.config_names)
                ok = (glob  # a glob of config names: *_tiny
                      or self._is_key(tok) or tok.isupper() or tok.endswith(FILE_SUFFIXES)
                      or tok in OUTSIDE_NAMES or tok in self.config_names
                      or all(p in user or p in self.help_words for p in PART.findall(tok))
                      or any(self._is_key(f"{section}.{tok}") for section in sections))
            if not ok:
                bad.append(tok)
        return bad

    @staticmethod
    def _path(tok: str) -> str:
        return re.sub(r"\[[^\]]*\]", "", tok)

    def _is_key(self, tok: str) -> bool:
        path = self._path(tok).replace("__", ".")  # roll_ma.train's keyword form (trainer__max_steps)
        return path in self.paths or any(path.startswith(k + ".") for k in self.open_keys)


def _config_names() -> list[str]:
    """The configs ``--list`` shows."""
    from roll_ma.config import available_configs

    return list(available_configs())


def _cli_flags() -> set[str]:
    from roll_ma.cli import build_parser

    return {s.lstrip("-") for a in build_parser()._actions for s in a.option_strings}
