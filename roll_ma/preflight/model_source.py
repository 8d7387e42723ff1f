"""Where a model or tokenizer a config names comes from, decided in seconds before anything loads it.

transformers takes any string that is not an existing directory for a hub name. A local path that does
not exist (``my-models/qwen-tiny``) then becomes a download, and where the hub cannot be reached that is
half a minute of retries per file before an error that talks about the cache. So the driver decides first:

- ``builtin:*`` and an existing local path are used as they are;
- a string that can only be a path and does not exist is refused as a missing local path: it starts with
  ``/``, ``./``, ``../`` or ``~``, has more than one ``/``, is no valid hub id, or its first folder exists
  here (``my-models/qwen-tiny`` next to a ``my-models`` folder);
- anything else is a hub name: used when the local hub cache holds it or the hub answers; refused when
  neither, saying why the hub cannot be reached (``HF_HUB_OFFLINE`` set, or no answer within
  ``PROBE_SECONDS``).
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

PROBE_SECONDS = 3.0
HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*$")  # name or namespace/name
EXAMPLE_HUB_NAME = "Qwen/Qwen2.5-0.5B-Instruct"
CACHE_PROBE_FILES = ("config.json", "tokenizer_config.json", "tokenizer.json")


@dataclass
class ModelSource:
    """Where one ``model.path`` / ``tokenizer_path`` value comes from.

    Attributes:
        path: what the loaders are given (a local directory or the hub name).
        problem: why it cannot be used (None: it can); the message without its config key.
        note: worth saying but allowed (a hub name read from the cache while the hub is unreachable).
    """

    path: str
    problem: str | None = None
    note: str | None = None


class Hub:
    """Whether the model hub can be reached from here, asked at most once (a probe of a few seconds)."""

    def __init__(self, probe_seconds: float = PROBE_SECONDS):
        self.probe_seconds = probe_seconds
        self._reason: str | None = None
        self._asked = False

    @property
    def endpoint(self) -> str:
        return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")

    def unreachable(self) -> str | None:
        """Why the hub cannot be reached (None: it answered)."""
        if not self._asked:
            self._asked, self._reason = True, self._ask()
        return self._reason

    def _ask(self) -> str | None:
        for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
            if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
                return f"{var} is set"
        answer: list[str | None] = []

        def ask() -> None:  # why a thread: a name lookup ignores the HTTP client's timeout
            try:
                import httpx

                httpx.head(self.endpoint, timeout=self.probe_seconds)  # any HTTP answer: it is reachable
                answer.append(None)
            except Exception as err:  # noqa: BLE001 - every failure means the same: no hub from here
                answer.append(f"{self.endpoint} cannot be reached ({type(err).__name__}: {_first_line(err)})")

        thread = threading.Thread(target=ask, daemon=True, name="roll_ma-hub-probe")
        thread.start()
        thread.join(self.probe_seconds + 1)
        if not answer:
            return f"{self.endpoint} did not answer within {self.probe_seconds:g} s"
        return answer[0]


def locate(name: str, hub: Hub) -> ModelSource:
    """Where ``name`` (a ``model.path`` or ``tokenizer_path`` value) comes from; see the module docstring."""
    from roll_ma.models.builtin import BUILTIN_MODELS
    from roll_ma.models.loading import resolve_model_path

    if name in BUILTIN_MODELS:
        try:
            return ModelSource(resolve_model_path(name))
        except FileNotFoundError as err:
            return ModelSource(name, str(err))
    local = Path(name).expanduser()
    if local.exists():
        return ModelSource(str(local))
    fix = (f"give the model's local directory (config.json, weights, tokenizer files), a hub name such as "
           f"{EXAMPLE_HUB_NAME}, or builtin:tiny")
    if _only_a_path(name):
        return ModelSource(name, f"{name} does not exist ({_what_is_there(local)}); {fix}")
    cached = _cached(name)
    reason = hub.unreachable()
    if reason is None:
        return ModelSource(name)
    if cached:
        return ModelSource(name, note=f"{name} is read from the local hub cache ({cached}) as the hub cannot "
                                      f"be reached ({reason}); HF_HUB_OFFLINE=1 skips asking it")
    return ModelSource(name, (
        f"{name} is not a local directory ({_what_is_there(local)}), and as a hub name it cannot be "
        f"downloaded: {reason}, and the local hub cache ({_cache_dir()}) does not hold it; give the model's "
        f"local directory, or download it where the hub can be reached (`hf download {name} --local-dir "
        "DIR`) and give that DIR"))


def _only_a_path(name: str) -> bool:
    """True when ``name`` cannot be a hub name, or names a folder that exists here."""
    if name.startswith(("/", "./", "../", "~")) or "\\" in name or re.match(r"^[A-Za-z]:", name):
        return True  # absolute, relative to here or home, or a Windows path
    if not HUB_ID.match(name) or "--" in name or ".." in name or name.endswith((".", "-")):
        return True
    first = name.split("/", 1)[0]
    return "/" in name and Path(first).expanduser().is_dir()


def _what_is_there(local: Path) -> str:
    """Where the path was looked for, and its nearest folder that exists."""
    where = local if local.is_absolute() else Path.cwd() / local
    parent = where.parent
    while not parent.is_dir() and parent != parent.parent:
        parent = parent.parent
    if parent == Path.cwd() or parent in Path.cwd().parents:  # its listing would be noise
        return f"no {where}"
    shown = sorted(p.name for p in parent.iterdir())
    holds = f"it holds {', '.join(shown[:6])}{', ...' if len(shown) > 6 else ''}" if shown else "it is empty"
    return f"no {where}; the nearest folder that exists is {parent}, {holds}"


def _cached(name: str) -> str | None:
    """The local hub cache's folder of ``name`` when it holds the model's files (None: it does not)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for filename in CACHE_PROBE_FILES:
        try:
            found = try_to_load_from_cache(name, filename)
        except Exception:  # noqa: BLE001 - a name the cache cannot hold is simply not cached
            return None
        if isinstance(found, str):
            return str(Path(found).parent)
    return None


def _cache_dir() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except ImportError:
        return "~/.cache/huggingface/hub"


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else ""
