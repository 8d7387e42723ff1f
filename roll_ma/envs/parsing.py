"""Turning raw model text into a legal action, strictly and safely.

Rules (the same for every game):

- The answer is the text between the answer tags, by default `<answer>...</answer>`. When the
  text holds several answers, the LAST complete one counts: the last closing tag and the last
  opening tag before it. Text outside the tags (thinking, chatter, "ignore the rules") is
  ignored.
- The inner text must equal a legal action string after whitespace normalisation: runs of
  whitespace (any Unicode whitespace) become one space, leading/trailing whitespace is
  dropped, and spaces next to `( ) [ ] ,` are dropped. So `( Play  0 )` matches `(Play 0)` and
  `x(1, 1)` matches `x(1,1)`, but `Play0`, `play 0` or `(Play 0).` do not (case matters).
- An action written as `(...)` may also be given without its parentheses: `Play 0`.
- No regex runs on the model text in tag mode (plain `str.rfind`), and normalisation is
  linear, so a 100 KB output costs microseconds, never catastrophic backtracking.
- A custom `answer_pattern` (a regex with one group) may replace the tags; it is searched in
  the last `max_pattern_chars` characters only, to bound its cost on huge outputs.

Nothing here raises on model text: the worst outcome is a `ParseResult` with an error.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

_WHITESPACE = re.compile(r"\s+")
_TIGHT_PUNCT = "()[],"
FALLBACK_MODES = ("random", "end")


def normalize_action(text: str) -> str:
    """Canonical form of an action string used for matching (see module docstring)."""
    s = _WHITESPACE.sub(" ", text).strip()
    if " " in s:
        # why: after the collapse there is at most one space on each side of a mark
        for p in _TIGHT_PUNCT:
            s = s.replace(" " + p, p).replace(p + " ", p)
    return s


@dataclass
class ParseResult:
    """Outcome of parsing one model output.

    Attributes:
        action: The matched legal action string (exactly as listed), or None.
        error: None on success, "no_answer" (no complete answer found) or "illegal_action".
        answer_text: The extracted answer text (cut to 200 characters), or None.
    """

    action: str | None
    error: str | None
    answer_text: str | None


class ActionParser:
    """Extracts the answer from model text and matches it to a legal action.

    Args:
        answer_tags: Opening and closing tag of the answer.
        answer_pattern: Optional regex with one capture group used instead of the tags.
        answer_template: How a built-in policy writes an action, with `{action}`; default
            `<open tag>{action}<close tag>`. Required with `answer_pattern`.
        max_pattern_chars: Only the tail of this many characters is searched by a pattern.
    """

    def __init__(
        self,
        answer_tags: tuple[str, str] | list[str] = ("<answer>", "</answer>"),
        answer_pattern: str | None = None,
        answer_template: str | None = None,
        max_pattern_chars: int = 16384,
    ):
        if len(answer_tags) != 2 or not all(isinstance(t, str) and t for t in answer_tags):
            raise ValueError(f"answer_tags must be two non-empty strings, got {answer_tags!r}")
        self.open_tag, self.close_tag = answer_tags
        self.max_pattern_chars = int(max_pattern_chars)
        self._lookup_key: tuple[str, ...] | None = None
        self._lookup: dict[str, str] = {}
        self._pattern = None
        if answer_pattern is not None:
            self._pattern = re.compile(answer_pattern, re.DOTALL)
            if self._pattern.groups < 1:
                raise ValueError(f"answer_pattern {answer_pattern!r} needs one capture group for the action")
            if answer_template is None:
                raise ValueError(
                    "answer_pattern needs answer_template (e.g. 'Action: {action}') for built-ins"
                )
        self.answer_template = answer_template or (self.open_tag + "{action}" + self.close_tag)
        if "{action}" not in self.answer_template:
            raise ValueError(f"answer_template {self.answer_template!r} must contain '{{action}}'")
        probe = "(Probe 0)"
        if self.extract(self.wrap(probe)) != probe:
            raise ValueError(
                f"answer_template {self.answer_template!r} does not parse back with the answer format"
            )

    def wrap(self, action: str) -> str:
        """The text a well-behaved model would write to choose `action`."""
        return self.answer_template.replace("{action}", action)

    def extract(self, text: object) -> str | None:
        """The inner text of the last complete answer, or None."""
        if not isinstance(text, str):
            text = "" if text is None else str(text)
        if self._pattern is not None:
            last = None
            for match in self._pattern.finditer(text[-self.max_pattern_chars :]):
                last = match.group(1) or ""
            return last
        close = text.rfind(self.close_tag)
        if close < 0:
            return None
        start = text.rfind(self.open_tag, 0, close)
        if start < 0:
            return None
        return text[start + len(self.open_tag) : close]

    def parse(self, text: object, legal_actions: list[str]) -> ParseResult:
        """Match the answer in `text` to one of `legal_actions` (strings as listed)."""
        inner = self.extract(text)
        if inner is None:
            return ParseResult(None, "no_answer", None)
        key = tuple(legal_actions)
        if key != self._lookup_key:  # why: one parse per turn usually, but tests parse many
            self._lookup_key, self._lookup = key, build_action_lookup(legal_actions)
        action = self._lookup.get(normalize_action(inner))
        shown = inner[:200]
        if action is None:
            return ParseResult(None, "illegal_action", shown)
        return ParseResult(action, None, shown)


def build_action_lookup(legal_actions: list[str]) -> dict[str, str]:
    """Map every accepted spelling (normalised) to its legal action string.

    Exact forms win over parenthesis-less aliases; a spelling shared by two actions is
    dropped so that matching is never ambiguous.
    """
    exact: dict[str, str] = {}
    exact_clashes: set[str] = set()
    for action in legal_actions:
        key = normalize_action(action)
        if key in exact and exact[key] != action:
            exact_clashes.add(key)
        exact[key] = action
    aliases: dict[str, str] = {}
    alias_clashes: set[str] = set()
    for key, action in exact.items():
        if key not in exact_clashes and len(key) > 2 and key[0] == "(" and key[-1] == ")":
            alias = key[1:-1].strip()
            if alias in aliases and aliases[alias] != action:
                alias_clashes.add(alias)
            aliases[alias] = action
    lookup = {k: v for k, v in aliases.items() if k not in alias_clashes and k not in exact}
    lookup.update({k: v for k, v in exact.items() if k not in exact_clashes})
    return lookup


def check_fallback(fallback: str) -> str:
    """Validate the `fallback` config value."""
    if fallback not in FALLBACK_MODES:
        raise ValueError(f"fallback must be one of {FALLBACK_MODES}, got {fallback!r}")
    return fallback


def fallback_rng(seed: int, turn: int) -> random.Random:
    """The rng of the `random` fallback at a turn: reproducible from (episode seed, turn)."""
    # why: a string seed is hashed with sha512 by `random`, stable across processes
    return random.Random(f"fallback:{seed}:{turn}")
