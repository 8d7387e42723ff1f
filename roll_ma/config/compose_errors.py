"""What YAML, Hydra and OmegaConf raise while a config is composed, said in config words: the file, line and
column of a YAML mistake (a bracket or quote left open: where it opens), the file and line of a ``defaults:``
entry that names no config (with the closest one there is), the override that cannot be read or applied,
the key of a ``${...}`` that does not resolve. ``compose.compose_raw`` turns each into a ``ConfigProblem``
(never a library traceback).
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]  # no stubs installed; what Hydra reads the files with

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
    """A YAML syntax error (``yaml.MarkedYAMLError``) as ``file:line:column: what``, with the line itself. A
    bracket or quote left open is pointed at where it opens (YAML notices it only later, where it stops)."""
    what = getattr(err, "problem", None) or getattr(err, "context", None) or first_line(err)
    mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
    if mark is None:
        return ConfigProblem(str(primary), f"is not valid YAML: {what}")
    file = _file_of(mark, primary)
    opened = _left_open(err, file)
    if opened is not None:
        mark, text = opened
        return ConfigProblem(
            f"{file}:{mark.line + 1}:{mark.column + 1}",
            f"not valid YAML: {text}{_source_line(file, mark.line, mark.column)}",
        )
    if "stream end" in what or "end of stream" in what:  # the file ended: point at what was left open
        mark = getattr(err, "context_mark", None) or mark
    hint = next((h for k, h in YAML_HINTS.items() if k in what), "fix the YAML syntax there")
    return ConfigProblem(
        f"{file}:{mark.line + 1}:{mark.column + 1}",
        f"not valid YAML: {what} ({hint}){_source_line(file, mark.line, mark.column)}",
    )


def _file_of(mark: Any, primary: Path) -> str:
    return mark.name if mark.name and not str(mark.name).startswith("<") else str(primary)


# YAML's names of what it found, in words
_FOUND = {"'<scalar>'": "a value", "'<stream end>'": "the end of the file", "':'": "a key's ':'"}
_QUOTES = {'"': 'double quote (")', "'": "single quote (')"}
_FLOWS = {"while parsing a flow mapping": ("{", "}"), "while parsing a flow sequence": ("[", "]")}


def _left_open(err: Any, file: str) -> tuple[Any, str] | None:
    """(mark of the opening, what to say) when the error is a ``{``, ``[`` or quote left open, else None."""
    context, problem = getattr(err, "context", None) or "", getattr(err, "problem", None) or ""
    start, stop = getattr(err, "context_mark", None), getattr(err, "problem_mark", None)
    if start is not None and context in _FLOWS:  # YAML names the collection it was reading: where it opened
        opener, closer = _FLOWS[context]
        found = problem.rsplit("but got ", 1)[-1]
        at = f"on line {stop.line + 1}, column {stop.column + 1} " if stop is not None else ""
        return start, (
            f"this '{opener}' is never closed: {at}YAML expected ',' or '{closer}' and found "
            f"{_FOUND.get(found, found)} (close it with '{closer}', or put a ',' between its entries)"
        )
    quoted = context.startswith("while scanning a quoted scalar")
    if start is not None and quoted and "end of stream" in problem:
        quote = _quote_at(file, start)
        return start, f"this {quote} is never closed: the file ends inside it (close it where its value ends)"
    if stop is not None:  # a quote closed by the next value's opening quote, lines later: YAML stops after it
        opening = _quoted_to(file, stop)
        if opening is not None:
            quote = _quote_at(file, opening)
            return opening, (
                f"this {quote} is not closed on its line: YAML takes the next one, on line {stop.line + 1}, "
                "as its end and cannot read what follows (close the quote on this line)"
            )
    return None


def _quote_at(file: str, mark: Any) -> str:
    try:
        char = Path(file).read_text(errors="replace").splitlines()[mark.line][mark.column]
    except (OSError, IndexError):
        return "quote"
    return _QUOTES.get(char, "quote")


def _quoted_to(file: str, stop: Any) -> Any:
    """The start of a quoted value that spans lines and ends on the line of ``stop`` (an unclosed quote that
    took the next quote as its end), or None."""
    try:
        text = Path(file).read_text(errors="replace")
    except OSError:
        return None
    found = None
    try:
        for token in yaml.scan(text, Loader=yaml.SafeLoader):
            if token.start_mark.index >= stop.index:
                break
            quoted = isinstance(token, yaml.ScalarToken) and token.style in ('"', "'")
            if quoted and token.start_mark.line < token.end_mark.line == stop.line:
                found = token.start_mark
    except yaml.YAMLError:
        pass
    return found


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


def defaults_problem(err: Any, config_dir: Path, primary: Path, shipped: list[str]) -> ConfigProblem:
    """A ``defaults:`` entry Hydra cannot find (``MissingConfigException``: "In 'mine': Could not load
    'basee'"), named by the file and line that list it, with the closest config of ``config_dir`` (else of
    the ``shipped`` configs' names, which an entry may name too)."""
    missing = str(getattr(err, "missing_cfg_file", "") or "").strip("/")
    named_in = re.match(r"In '([^']+)'", str(err))
    listing = config_dir / f"{named_in.group(1)}.yaml" if named_in else primary
    line = _defaults_line(listing, missing)
    where = f"{listing}:{line}" if line else str(listing)
    group, _, option = missing.rpartition("/")
    options = getattr(err, "options", None)
    if options:  # an option of a config group (``- model: tinyy``): the group's own options
        what = f"defaults: {group}: {option!r} is no config in {config_dir / group}"
        close, known = _closest(option, options), list(options)
    elif options == [] and group:  # the group itself is missing (``- modell: tiny``)
        what = f"defaults: {group!r} is no config group (a folder) in {config_dir}"
        known = sorted(str(d.relative_to(config_dir)) for d in config_dir.rglob("*") if d.is_dir())
        close = _closest(group, known)
    else:
        what = f"defaults: {missing!r} is no config in {config_dir}"
        known = sorted(str(f.relative_to(config_dir).with_suffix("")) for f in config_dir.rglob("*.yaml"))
        close = _closest(missing, known) or _closest(missing, shipped)
    fix = f"did you mean {close!r}?" if close else f"there are: {', '.join(known[:12]) or 'none'}"
    return ConfigProblem(where, f"{what}; {fix} (an entry names a config there by its path, without .yaml)")


def _closest(word: str, options: list[str]) -> str | None:
    close = difflib.get_close_matches(word, [str(o) for o in options], n=1, cutoff=0.6)
    return close[0] if close else None


def _defaults_line(file: Path, missing: str) -> int | None:
    """The line of ``file``'s defaults entry that names ``missing`` (``name``, ``/name``, ``group: option``,
    ``override group: option``), else of its ``defaults:`` key; None when the file cannot be read."""
    try:
        root = yaml.compose(file.read_text(errors="replace"), Loader=yaml.SafeLoader)
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(root, yaml.MappingNode):
        return None
    for key, value in root.value:
        if key.value != "defaults":
            continue
        for entry in value.value if isinstance(value, yaml.SequenceNode) else []:
            if _names(entry, missing):
                return int(entry.start_mark.line) + 1
        return int(key.start_mark.line) + 1
    return None


def _names(entry: Any, missing: str) -> bool:
    if isinstance(entry, yaml.ScalarNode):
        return str(entry.value).strip("/") == missing or missing.endswith("/" + str(entry.value).strip("/"))
    if isinstance(entry, yaml.MappingNode) and len(entry.value) == 1:
        group, option = entry.value[0]
        group_name = str(group.value).split()[-1].strip("/")  # "override model", "optional model"
        return f"{group_name}/{option.value}" == missing or missing.endswith(f"/{group_name}/{option.value}")
    return False


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
