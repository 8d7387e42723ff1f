"""The model a config names, probed in the driver: its config loads, its weights are there, and its
tokenizer is a real one (not empty, an end-of-turn token, a chat template where prompts need one).

transformers builds an empty tokenizer, without complaint, from a model directory that holds no
tokenizer files; the run would die much later on "chat_template is not set". This check names the
tokenizer's location and ``model.tokenizer_path`` instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roll_ma.config.schema import ModelConfig
from roll_ma.preflight.model_source import Hub, ModelSource, locate

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "merges.txt",
                   "vocab.txt")
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
PROBE_TEXT = "Hello, 12 + 30 = 42."
MODEL_FOLDER = "give the model's folder (config.json, weights, tokenizer files), a hub name, or builtin:tiny"


@dataclass
class ModelProbe:
    """What the driver learned about one model (None where it could not be loaded)."""

    tokenizer: Any = None
    max_positions: int | None = None  # max_position_embeddings of the model's config
    vocab_size: int | None = None


def probe_model(model: ModelConfig, prefix: str, chat_needed_by: str | None, hub: Hub | None = None,
                notes: list[str] | None = None) -> tuple[ModelProbe, list[str]]:
    """Load ``model``'s config and tokenizer as the workers will; every problem names ``prefix``'s keys
    (``model`` or ``teacher.model``). ``chat_needed_by``: what needs a chat template (None: nothing).

    Each location is looked for first (``model_source.locate``: a missing local path or a hub name the hub
    cannot give is one problem, found in seconds), and one cause gives one problem: a config that does
    not load is not reported again as a tokenizer problem of the same directory. ``notes`` receives what
    is allowed but worth saying (a hub name read from the cache)."""
    probe = ModelProbe()
    problems: list[str] = []
    if model.random_weights:  # benchmarks: an architecture built later, with a built-in tokenizer
        return probe, problems
    hub = hub or Hub()
    source = locate(model.path, hub)
    config_loaded = False
    if source.problem:
        problems.append(f"{prefix}.path: {source.problem}")
    else:
        config_loaded = _probe_config(model, source.path, prefix, probe, problems)
    _note(notes, f"{prefix}.path", source)
    if model.tokenizer_path:
        tok_source = locate(model.tokenizer_path, hub)
        _note(notes, f"{prefix}.tokenizer_path", tok_source)
        if tok_source.problem:
            problems.append(f"{prefix}.tokenizer_path: {tok_source.problem}")
            return probe, problems
        if Path(tok_source.path).is_file():
            problems.append(f"{prefix}.tokenizer_path: {tok_source.path} is a file, not a folder; give the "
                            f"folder that holds the tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...)")
            return probe, problems
    elif source.problem:
        return probe, problems  # the same location: its problem is said once
    elif not config_loaded:  # the tokenizer would fail on the same config.json, already reported
        held = _tokenizer_files(source.path) or []
        if (Path(source.path) / "config.json").is_file() and not set(held) & set(TOKENIZER_FILES):
            # a damaged config.json in a folder without tokenizer files: two causes, two fixes
            problems.append(f"{prefix}.path: {source.path} holds no tokenizer files; "
                            f"{_tokenizer_fix(prefix, source.path)}")
        return probe, problems
    _probe_tokenizer(model, prefix, chat_needed_by, probe, problems)
    return probe, problems


def _note(notes: list[str] | None, key: str, source: ModelSource) -> None:
    if notes is not None and source.note:
        notes.append(f"{key}: {source.note}")


def _probe_config(model: ModelConfig, path: str, prefix: str, probe: ModelProbe, problems: list[str]) -> bool:
    """Load the model's config (True when it loads) and look for its weights."""
    from transformers import AutoConfig

    local_problem = _local_config_problem(Path(path))
    if local_problem:
        problems.append(f"{prefix}.path: {local_problem}")
        return False
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=model.trust_remote_code)
    except Exception as err:  # noqa: BLE001 - any failure here is the same failure the workers would meet
        problems.append(f"{prefix}.path: cannot load the model's config from {path} "
                        f"({type(err).__name__}: {_first_line(err)}); give a model directory with a "
                        "config.json, or a hub name")
        return False
    text = getattr(config, "get_text_config", lambda: config)()
    probe.max_positions = getattr(text, "max_position_embeddings", None)
    probe.vocab_size = getattr(text, "vocab_size", None)
    local = Path(path)
    if local.is_dir() and not any(p.suffix in WEIGHT_SUFFIXES for p in local.iterdir()):
        problems.append(f"{prefix}.path: {path} holds a config.json but no weights (*.safetensors, *.bin); "
                        "copy the model's weight files there")
    elif local.is_dir():
        problems += [f"{prefix}.path: {p}" for p in _damaged_safetensors(local)]
    return True


def _local_config_problem(local: Path) -> str | None:
    """What is wrong with a local model path before transformers reads it: a file, a folder without a
    config.json, a config.json that is not JSON (transformers says only "give a model directory")."""
    if local.is_file():
        return f"{local} is a file, not a model folder; {MODEL_FOLDER}"
    if not local.is_dir():
        return None  # a hub name
    config = local / "config.json"
    if not config.is_file():
        return f"{local} holds no config.json ({_held(local)}); {MODEL_FOLDER}"
    try:
        json.loads(config.read_bytes())
    except json.JSONDecodeError as err:
        return (f"{config} is not valid JSON: {err.msg.removesuffix(' at')} at line {err.lineno}, column "
                f"{err.colno}; it is damaged or cut short: copy it again from where the model came from")
    except (UnicodeDecodeError, OSError) as err:
        return f"{config} cannot be read as JSON text ({err}); copy it again from where the model came from"
    return None


def _damaged_safetensors(local: Path) -> list[str]:
    """Weight files whose header does not read (a copy cut short); read in milliseconds, not loaded."""
    from safetensors import safe_open

    damaged = []
    for file in sorted(local.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except Exception as err:  # noqa: BLE001 - whatever the reason, the workers could not load it
            damaged.append(f"{file} does not read as safetensors ({type(err).__name__}: {_first_line(err)}): "
                           "it is damaged or cut short; copy it again from where the model came from")
    return damaged


def _held(folder: Path) -> str:
    names = sorted(p.name for p in folder.iterdir())
    if not names:
        return "it is empty"
    return f"it holds {', '.join(names[:6])}{', ...' if len(names) > 6 else ''}"


def _probe_tokenizer(model: ModelConfig, prefix: str, chat_needed_by: str | None, probe: ModelProbe,
                     problems: list[str]) -> None:
    from roll_ma.models.loading import load_tokenizer, resolve_model_path

    key = f"{prefix}.tokenizer_path" if model.tokenizer_path else f"{prefix}.path"
    where = resolve_model_path(model.tokenizer_path or model.path)
    fix = _tokenizer_fix(prefix, where)
    try:
        tok = load_tokenizer(model)
    except Exception as err:  # noqa: BLE001 - the workers would fail the same way, later
        problems.append(f"{key}: cannot load the tokenizer from {where} ({type(err).__name__}: "
                        f"{_first_line(err)}); {fix}")
        return
    size = len(tok)
    if size < 2 or not tok(PROBE_TEXT, add_special_tokens=False)["input_ids"]:
        found = _tokenizer_files(where)
        held = ("it is not a local directory" if found is None
                else f"it holds only {found}" if found else "it holds no tokenizer files")
        tokens = f"{size} token{'s' * (size != 1)}"
        problems.append(f"{key}: the tokenizer loaded from {where} is empty ({tokens}; {held}); {fix}")
        return
    probe.tokenizer = tok
    if tok.eos_token_id is None:
        problems.append(f"{key}: the tokenizer from {where} has no end-of-sequence token (eos_token), which "
                        "ends every reply; use the model's own tokenizer or one with an eos_token")
    if probe.vocab_size is not None and size > probe.vocab_size:
        problems.append(f"{key}: the tokenizer from {where} has {size} tokens but the model's embedding has "
                        f"{probe.vocab_size} rows (config.json vocab_size): ids from {probe.vocab_size} on "
                        f"would index past it; {prefix}.tokenizer_path must name this model's tokenizer")
    if chat_needed_by and not getattr(tok, "chat_template", None):
        problems.append(f"{key}: the tokenizer from {where} has no chat template, which {chat_needed_by} "
                        f"needs; use a chat (Instruct) model, or set {prefix}.tokenizer_path to a tokenizer "
                        "that has one (a chat_template.jinja or tokenizer_config.json with chat_template)")


def _tokenizer_fix(prefix: str, where: str) -> str:
    return (f"copy the tokenizer files ({', '.join(TOKENIZER_FILES[:2])}, ...) into {where}, or set "
            f"{prefix}.tokenizer_path to the directory or hub name of the model's tokenizer")


def _tokenizer_files(where: str) -> list[str] | None:
    """The tokenizer files a local directory holds (None: not a local directory)."""
    path = Path(where)
    if not path.is_dir():
        return None
    names = (*TOKENIZER_FILES, "chat_template.jinja")
    return sorted(p.name for p in path.iterdir() if p.name in names)


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else ""
