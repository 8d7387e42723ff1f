"""Every command README.md and docs/ give works as written in the venv ``scripts/setup.sh`` makes (the pages
say to activate it, or write ``.venv/bin/python``): a ``start_pipeline.py`` command parses and its config
composes and validates (as ``--cfg`` would, without running); a script or test file it names exists and
takes the flags it is given; a module exists; a pip extra is one pyproject.toml defines.

Commands are taken from the pages' shell blocks (and blocks without a language) and from inline code that
starts with ``python``, ``.venv/bin/python`` or ``bash``. Placeholders (``<name>``, ``...``, ``/path/to``)
are left unchecked where they stand; the rest of such a command is checked.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
SHELL_BLOCKS = ("bash", "sh", "shell", "console", "")
PYTHONS = ("python", "python3", ".venv/bin/python")
PROGRAMS = (*PYTHONS, "bash", "pip", ".venv/bin/pip", "ruff", ".venv/bin/ruff")
PLACEHOLDER = re.compile(r"<[^>]*>|\.\.\.|/path/to")


def _block_lines(text: str) -> list[tuple[int, str]]:
    """(line number, command line) of the page's shell blocks, continuation lines joined."""
    out: list[tuple[int, str]] = []
    fence, joined, start = None, "", 0
    for i, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\s*(```|~~~)(\w*)", line)
        if m:
            fence = None if fence is not None else m.group(2)
            continue
        if fence not in SHELL_BLOCKS:
            continue
        joined, start = (joined + " " + line.strip(), start) if joined else (line.strip(), i)
        if joined.endswith("\\"):
            joined = joined[:-1].rstrip()
            continue
        out.append((start, joined))
        joined = ""
    return out


def _inline(text: str) -> list[tuple[int, str]]:
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        for span in re.findall(r"`([^`]+)`", line):
            if re.match(r"^(\.venv/bin/)?python3? \S|^bash \S", span):
                out.append((i, span))
    return out


def commands(page: Path) -> list[tuple[int, list[str]]]:
    """(line number, argv without leading VAR=value) of each command of ``page`` that runs a program of
    roll_ma's set-up (python, bash, pip, ruff; not ``ray`` or ``docker``)."""
    text = page.read_text()
    found = []
    for line_no, line in _block_lines(text) + _inline(text):
        try:
            words = shlex.split(line, comments=True)
        except ValueError:  # an unbalanced quote: not a command but a quoted message
            continue
        words = [part for w in words for part in re.split(r"(;)$", w) if part]  # `a; b`: `;` ends a word
        argv: list[str] = []
        for word in [*words, "&&"]:
            if word in ("&&", ";", "||", "|"):
                while argv and re.match(r"^[A-Z_][A-Z0-9_]*=", argv[0]):
                    argv.pop(0)
                if argv and argv[0] in PROGRAMS:
                    found.append((line_no, argv))
                argv = []
            else:
                argv.append(word)
    return found


def _concrete(word: str) -> bool:
    return not PLACEHOLDER.search(word)


def check_start_pipeline(args: list[str]) -> str | None:
    from roll_ma.cli import build_parser
    from roll_ma.cli_cfg import cfg_argv
    from roll_ma.config import ConfigError, available_configs
    from roll_ma.config.compose import mars_flags_to_overrides
    from roll_ma.preflight.config_loader import load_config

    try:
        ns = build_parser().parse_intermixed_args(cfg_argv(args))
    except SystemExit:
        return "start_pipeline.py does not take these arguments"
    if ns.list or ns.describe or not ns.config_name:
        return None
    if not all(_concrete(w) for w in [ns.config_name, ns.config_path or ""]):
        return None  # "your own yaml": nothing to compose
    if ns.config_name not in available_configs(ns.config_path):
        return f"no config {ns.config_name!r} (start_pipeline.py --list)"
    overrides = mars_flags_to_overrides(ns.num_agents, ns.lora_rank, ns.lora_alpha) + [
        o for o in ns.overrides if _concrete(o)]
    try:
        load_config(ns.config_name, ns.config_path, overrides, num_agents=ns.num_agents,
                    check_local_gpus=False)
    except ConfigError as err:
        return f"the config is refused: {err}"
    return None


def check_script(path: str, args: list[str]) -> str | None:
    script = ROOT / path
    if not script.is_file():
        return f"no file {path}"
    source = script.read_text()
    # a flag may come from a parser in a module beside the script (benchmarks/common.py's base_parser)
    for name in re.findall(r"^from (\w+) import", source, re.M):
        if (script.parent / f"{name}.py").is_file():
            source += (script.parent / f"{name}.py").read_text()
    flags = [a.split("=")[0] for a in args if a.startswith("--") and _concrete(a.split("=")[0])]
    unknown = [f for f in flags if f not in source]
    if script.suffix == ".sh" and args and _concrete(args[0]) and not args[0].startswith("-"):
        unknown += [args[0]] if args[0] not in source else []
    return f"{path} knows no {', '.join(unknown)}" if unknown else None


def check_python(args: list[str]) -> str | None:
    if args[:2] == ["-m", "pytest"]:
        paths = [a.split("::")[0] for a in args[2:] if not a.startswith("-") and "/" in a]
        missing = [p for p in paths if not (ROOT / p).exists()]
        return f"no test path {', '.join(missing)}" if missing else None
    if args[0] == "-m":
        return None if importlib.util.find_spec(args[1]) else f"no module {args[1]}"
    if args[0] == "-c":
        return None
    if Path(args[0]).name == "start_pipeline.py":
        return check_start_pipeline(args[1:])
    return check_script(args[0], args[1:])


def check_pip(args: list[str]) -> str | None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for spec in args:
        m = re.match(r"^(\.|roll_ma)\[([\w,-]+)\]$", spec)
        if m:
            unknown = [e for e in m.group(2).split(",") if e not in extras]
            if unknown:
                return f"pyproject.toml has no extra {', '.join(unknown)}"
    return None


def check(argv: list[str]) -> str | None:
    """What is wrong with the command ``argv`` (None: it is fine)."""
    program, args = argv[0], argv[1:]
    if program in PYTHONS:
        return check_python(args) if args else None
    if program == "bash":
        return check_script(args[0], args[1:])
    if program.endswith("pip"):
        return check_pip(args)
    missing = [a for a in args[1:] if not a.startswith("-") and not (ROOT / a).exists()]  # ruff check PATHS
    return f"no path {', '.join(missing)}" if missing else None


@pytest.mark.parametrize("page", [p for p in PAGES if commands(p)], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_documented_command_works_as_written(page):
    problems = [f"{page.relative_to(ROOT)} (line {n}): {' '.join(argv)}: {why}"
                for n, argv in commands(page) if (why := check(argv))]
    assert not problems, "\n".join(problems)


def test_commands_are_found_in_blocks_and_inline_code_with_continuations(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Run `python start_pipeline.py --list` first.\n\n```bash\n"
                    "bash scripts/setup.sh && .venv/bin/python -m pytest -q   # the tests\n"
                    "RAY_ADDRESS=<head>:6379 python start_pipeline.py --config_name x \\\n"
                    "    trainer.max_steps=2\nray start --head\n```\n\n```\nerror: pip install vllm\n```\n")
    assert commands(page) == [
        (4, ["bash", "scripts/setup.sh"]), (4, [".venv/bin/python", "-m", "pytest", "-q"]),
        (5, ["python", "start_pipeline.py", "--config_name", "x", "trainer.max_steps=2"]),
        (1, ["python", "start_pipeline.py", "--list"]),
    ]
    assert check(["python", "start_pipeline.py", "--config_name", "x"]) == (
        "no config 'x' (start_pipeline.py --list)")
    assert "refused" in check(["python", "start_pipeline.py", "--config_name", "math_selfplay_tiny",
                               "trainer.max_steps=oops"])
    assert check(["bash", "scripts/setup.sh", "--nope"]) == "scripts/setup.sh knows no --nope"
    assert check(["pip", "install", "-e", ".[gpu]"]) == "pyproject.toml has no extra gpu"


@pytest.mark.parametrize("page", ["README.md", "docs/getting-started.md"])
def test_a_bare_python_comes_only_after_the_page_says_to_activate_the_venv(page):
    """`python ...` in a fresh shell after scripts/setup.sh is the system's, which has no roll_ma: the pages a
    newcomer starts from write `.venv/bin/python` until they have said `source .venv/bin/activate`."""
    text = (ROOT / page).read_text()
    activated = text.index("source .venv/bin/activate")
    activated_line = text[:activated].count("\n") + 1
    bare = [(n, argv) for n, argv in commands(ROOT / page) if argv[0] in ("python", "python3", "pip")]
    early = [f"line {n}: {' '.join(argv)}" for n, argv in bare if n < activated_line]
    where = f"{page}: before `source .venv/bin/activate` (line {activated_line})"
    assert not early, where + ":\n" + "\n".join(early)
