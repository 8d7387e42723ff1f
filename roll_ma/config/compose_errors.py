"""What YAML, Hydra and OmegaConf raise while a config is composed, said in config words: the file, line and
column of a YAML mistake, the override that cannot be read or applied, the key of a ``${...}`` that does
not resolve. ``compose.compose_raw`` turns each into a ``ConfigProblem`` (never a library traceback).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from roll_ma.errors import ConfigProblem

OVERRIDE_FORM = (
    "write it as key=value: a list is [a,b], a mapping {k: v}; quote a value that holds "
    "[ ] { } , = ' or a space, e.g. model.path='my dir/model'"
)
INTERPOLATION_FIX = "a ${...} names another key of this config, e.g. output_dir: outputs/${name}"
# the usual cause of a YAML message, where its own words do not say it
YAML_HINTS = {
    "mapping values are not allowed": "most often a key indented differently from the keys beside it, or an "
    "unquoted value holding ': ', which needs quotes",
    "cannot start any token": "YAML indents with spaces, never tabs",
    "found duplicate key": "the key is given twice in one mapping; keep one",
    "expected <block end>": "most often a line indented differently from the lines beside it",
    "end of stream": "a quote or bracket opened here and never closed",
    "<stream end>": "a quote or bracket opened here and never closed",
    "could not find expected ':'": "a line that is neither 'key: value' nor a list item '- value'",
}


def first_line(err: BaseException) -> str:
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    return lines[0] if lines else type(err).__name__


def override_problems(overrides: list[str]) -> list[ConfigProblem]:
    """Overrides that cannot be read at all (no ``=``, no key, outside Hydra's grammar), each named."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    problems = []
    for override in overrides:
        if "=" not in override and not override.startswith("~"):  # ~key deletes a key
            problems.append(ConfigProblem(override, "an override must look like key=value"))
            continue
        if not override.split("=", 1)[0].lstrip("+~"):
            problems.append(ConfigProblem(override, "names no key; write key=value, e.g. seed=1"))
            continue
        try:
            parser.parse_overrides([override])
        except HydraException as err:
            reason = _grammar_reason(err)
            problems.append(ConfigProblem(override, f"cannot be read: {reason}; {OVERRIDE_FORM}"))
    return problems


def _grammar_reason(err: BaseException) -> str:
    """Hydra's parse error without its own echo of the override and its link."""
    lines = [ln.strip() for ln in str(err).splitlines()]
    said = [ln for ln in lines if ln and not ln.startswith(("See https://", "Error parsing override", "^"))]
    reason = said[0] if said else "not key=value"
    if reason.startswith("LexerNoViableAltException"):
        return "a character here cannot start a value, e.g. an unclosed quote or a space in a key"
    if reason.startswith("no viable alternative at input"):
        return reason.replace("no viable alternative at input ", "") + " (an unclosed bracket or quote?)"
    return reason.split(" expecting {", 1)[0]


def yaml_problem(err: Any, primary: Path) -> ConfigProblem:
    """A YAML syntax error (``yaml.MarkedYAMLError``) as ``file:line:column: what``, with the line itself."""
    what = getattr(err, "problem", None) or getattr(err, "context", None) or first_line(err)
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    if "stream end" in what or "end of stream" in what:  # the file ended: point at what was left open
        mark = getattr(err, "context_mark", None) or mark
    if mark is None:
        return ConfigProblem(str(primary), f"is not valid YAML: {what}")
    file = mark.name if mark.name and not mark.name.startswith("<") else str(primary)
    hint = next((h for k, h in YAML_HINTS.items() if k in what), "fix the YAML syntax there")
    return ConfigProblem(
        f"{file}:{mark.line + 1}:{mark.column + 1}",
        f"not valid YAML: {what} ({hint}){_source_line(file, mark.line, mark.column)}",
    )


def _source_line(file: str, line: int, column: int) -> str:
    """The file's line, and a caret under the column (empty when the file cannot be read)."""
    try:
        text = Path(file).read_text(errors="replace").splitlines()[line]
    except (OSError, IndexError):
        return ""
    shown = text.expandtabs(1)
    return f"\n      {shown}\n      {' ' * min(column, len(shown))}^"


def undecodable_problem(err: UnicodeDecodeError, primary: Path) -> ConfigProblem:
    """A config file that is not UTF-8 text: the primary one when it is, else one its defaults list names."""
    try:
        data = primary.read_bytes()
        data.decode("utf-8")
    except UnicodeDecodeError as own:
        line = data[: own.start].count(b"\n") + 1
        return ConfigProblem(
            f"{primary}:{line}", f"is not UTF-8 text ({own.reason} at byte {own.start}); save it as UTF-8"
        )
    except OSError:
        pass
    return ConfigProblem(
        str(primary), f"a file its defaults list includes is not UTF-8 text ({err.reason}); save it as UTF-8"
    )


def interpolation_problem(err: Any, overrides: list[str], primary: Path) -> ConfigProblem:
    """A ``${...}`` that does not resolve: named by its key, and by the override or file that wrote it."""
    key = getattr(err, "full_key", None) or ""
    by = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") == key]
    where = f"set by the override {by[-1]}" if by else f"in {primary}"
    return ConfigProblem(key or str(primary), f"{first_line(err)} ({where}); {INTERPOLATION_FIX}")


def composition_problem(err: BaseException, source: str) -> ConfigProblem:
    """What Hydra could not compose (a key an override cannot set, a default that is missing, a config
    that is not a mapping), named by ``source``: the override, or the config file."""
    text = first_line(err)
    if text.startswith("Error merging override"):  # Hydra repeats the override, as roll_ma passed it
        text = "cannot be applied"
    cause = err.__cause__
    if cause is not None and first_line(cause) not in text:
        text = f"{text.rstrip('.')}: {first_line(cause)}"
    if "must be a DictConfig" in text:
        text = "must be a mapping of config keys (name: ..., model: ...), not a list or a single value"
    hint = list_index_hint(source, text)
    return ConfigProblem(source, f"{text}; {hint}" if hint else text)


def list_index_hint(override: str, text: str) -> str | None:
    """How to address a list's entry, where an override's key used a position the list lacks or a name
    (``agents.3.lr`` with three agents, ``agents.solver.lr``): lists are addressed by position from 0."""
    named = re.search(r"Index '([^']*)' \(str\) is not an int", text)
    if not named and "list index out of range" not in text:
        return None
    parts = override.split("=", 1)[0].lstrip("+~").split(".")
    at = next((i for i, p in enumerate(parts) if p.isdigit() or (named and p == named.group(1))), None)
    if not at:
        return None
    lst, rest = ".".join(parts[:at]), ".".join(parts[at + 1 :])
    example = f"{lst}.0.{rest}" if rest else f"{lst}.0"
    return (f"{lst} is a list: its entries are addressed by position from 0, in the order the config lists "
            f"them (e.g. {example}=...)")
