"""Every link of README.md and docs/ resolves: a relative link names a file or folder of the repository, and
its #anchor (or a page's own #anchor) is a heading of that page, as GitHub spells the heading's anchor."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
FENCE = re.compile(r"^\s*(```|~~~)")
# [text](target) and ![alt](target); the target may carry a title: (path "title")
INLINE = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HTML = re.compile(r"""(?:href|src)\s*=\s*["']([^"']+)["']""")


def _prose(text: str) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks, with their line numbers."""
    lines, fenced = [], False
    for i, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append((i, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: the rendered text, lower case, with every character other than a letter,
    digit, space, ``-`` or ``_`` dropped and each space made a ``-``."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"(?<!\w)_+|_+(?!\w)", "", text)  # _emphasis_ marks, not snake_case
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors a page offers: its headings' (a repeated one gets -1, -2, ...) and explicit HTML ids."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    text = page.read_text()
    for _, line in _prose(text):
        m = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    found.update(re.findall(r"""<a\s+(?:name|id)\s*=\s*["']([^"']+)["']""", text))
    return found


def links(page: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link on the page outside code."""
    out = []
    for i, line in _prose(page.read_text()):
        line = re.sub(r"`[^`]*`", "``", line)  # a link shown as code is no link
        for pattern in (INLINE, REFERENCE, HTML):
            out += [(i, target) for target in pattern.findall(line)]
    return out


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    """What is wrong with each broken link of ``page`` (under ``root``), a line each (empty: all resolve)."""
    problems = []
    for line, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto: ... (no network in tests)
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{page.relative_to(root)} (line {line}): {target}"
        shown = dest.relative_to(root) if dest.is_relative_to(root) else dest
        if not dest.exists():
            problems.append(f"{where}: no file {shown}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: no heading with the anchor #{anchor} in {shown}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page):
    assert not broken_links(page), "\n".join(broken_links(page))


def test_slug_follows_githubs_rules():
    assert slug("Checking a config without running it: `--cfg`") == (
        "checking-a-config-without-running-it---cfg")
    assert slug("The 7B step (2026-11-26): 88 -> 66.7 s on one H100 (issue 31)") == (
        "the-7b-step-2026-11-26-88---667-s-on-one-h100-issue-31")
    assert slug("What `math_reflection_tiny` printed") == "what-math_reflection_tiny-printed"
    assert slug("Ctrl-C, SIGTERM and what a run leaves behind") == (
        "ctrl-c-sigterm-and-what-a-run-leaves-behind")


def test_checker_finds_a_missing_file_and_a_wrong_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Real heading\n\n```\n# not a heading\n```\n")
    page = tmp_path.resolve() / "page.md"
    page.write_text("[a](other.md#real-heading) [b](missing.md) [c](other.md#not-a-heading) "
                    "[d](https://example.com/x) `[e](inline-code.md)`\n```\n[f](in-a-fence.md)\n```\n")
    problems = broken_links(page, tmp_path.resolve())
    assert len(problems) == 2, problems
    assert "no file missing.md" in problems[0]
    assert "no heading with the anchor #not-a-heading in other.md" in problems[1]
