"""Reading OpenSpiel's Hanabi observation string, and writing it back readably.

OpenSpiel renders a Hanabi observation as
```
Life tokens: 3
Info tokens: 8
Fireworks: R0 Y0
Hands:
Cur player
XX || XX|RY12        <- observer's own hand (hidden), hinted color/rank, possible colors+ranks
-----
R1 || XX|RY12        <- the next player's hand (visible card), what that player knows
Deck size: 2
Discards: R1 Y2
```
`parse_observation` turns it into a `HanabiView`; `render_view` writes the text the model sees.
"""

from __future__ import annotations

from dataclasses import dataclass, field

COLOR_NAMES = {"R": "red", "Y": "yellow", "G": "green", "W": "white", "B": "blue"}


@dataclass
class CardView:
    """One card as the observer sees it.

    Attributes:
        color: Visible color letter, or None for the observer's own (hidden) card.
        rank: Visible rank (1-based), or None when hidden.
        hinted_color: Color revealed by hints, or None.
        hinted_rank: Rank revealed by hints, or None.
        possible_colors: Colors still possible given all hints, e.g. "RY".
        possible_ranks: Ranks still possible given all hints, e.g. (1, 2).
    """

    color: str | None
    rank: int | None
    hinted_color: str | None
    hinted_rank: int | None
    possible_colors: str
    possible_ranks: tuple[int, ...]

    def candidates(self) -> list[tuple[str, int]]:
        """Every (color, rank) this card may be, from its owner's point of view."""
        return [(c, r) for c in self.possible_colors for r in self.possible_ranks]


@dataclass
class HanabiView:
    """A parsed observation. `hands[0]` is the observer's hand, `hands[k]` player +k's hand."""

    life_tokens: int = 0
    info_tokens: int = 0
    fireworks: dict[str, int] = field(default_factory=dict)
    hands: list[list[CardView]] = field(default_factory=list)
    current_hand: int = 0
    deck_size: int = 0
    discards: list[str] = field(default_factory=list)

    def is_playable(self, color: str, rank: int) -> bool:
        return self.fireworks.get(color, -1) == rank - 1

    def is_useless(self, color: str, rank: int) -> bool:
        return self.fireworks.get(color, 0) >= rank


def parse_card(line: str) -> CardView:
    """Parse one card line like `R1 || XX|RY12`."""
    actual, _, knowledge = line.partition("||")
    actual = actual.strip()
    hinted, _, possible = knowledge.strip().partition("|")
    color = actual[0] if len(actual) == 2 and actual[0] != "X" else None
    rank = int(actual[1]) if len(actual) == 2 and actual[1].isdigit() else None
    hinted_color = hinted[0] if len(hinted) == 2 and hinted[0] != "X" else None
    hinted_rank = int(hinted[1]) if len(hinted) == 2 and hinted[1].isdigit() else None
    colors = "".join(ch for ch in possible if ch.isalpha())
    ranks = tuple(int(ch) for ch in possible if ch.isdigit())
    return CardView(color, rank, hinted_color, hinted_rank, colors, ranks)


def parse_observation(text: str) -> HanabiView:
    """Parse OpenSpiel's `observation_string` of a Hanabi state."""
    view = HanabiView()
    in_hands = False
    hand: list[CardView] = []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("Life tokens:"):
            view.life_tokens = int(line.split(":")[1])
        elif line.startswith("Info tokens:"):
            view.info_tokens = int(line.split(":")[1])
        elif line.startswith("Fireworks:"):
            for token in line.split(":")[1].split():
                view.fireworks[token[0]] = int(token[1:])
        elif line == "Hands:":
            in_hands = True
        elif line.startswith("Deck size:"):
            in_hands = False
            view.hands.append(hand)
            view.deck_size = int(line.split(":")[1])
        elif line.startswith("Discards:"):
            view.discards = line.split(":")[1].split()
        elif in_hands and line == "Cur player":
            view.current_hand = len(view.hands)
        elif in_hands and line == "-----":
            view.hands.append(hand)
            hand = []
        elif in_hands and "||" in line:
            hand.append(parse_card(line))
    return view


def _hint_text(card: CardView) -> str:
    known = []
    if card.hinted_color:
        known.append(f"color {card.hinted_color}")
    if card.hinted_rank:
        known.append(f"rank {card.hinted_rank}")
    could = f"could be {' '.join(card.possible_colors)} / {' '.join(map(str, card.possible_ranks))}"
    return f"hints: {', '.join(known) or 'none'}; {could}"


def render_view(
    view: HanabiView,
    player: int,
    num_players: int,
    max_info: int,
    max_life: int,
    max_score: int,
    last_moves: list[str],
) -> str:
    """The readable observation of the acting player `player`."""
    score = sum(view.fireworks.values())
    fireworks = ", ".join(f"{c} {n}" for c, n in view.fireworks.items())
    lines = [
        f"You are player {player} of {num_players}.",
        f"Life tokens: {view.life_tokens} of {max_life}. Info tokens: {view.info_tokens} of {max_info}. "
        f"Deck: {view.deck_size} cards left.",
        f"Fireworks: {fireworks} (score {score} of {max_score}).",
        f"Discards: {' '.join(view.discards) or 'none'}.",
        "Your hand (you cannot see your cards):",
    ]
    for i, card in enumerate(view.hands[0] if view.hands else []):
        lines.append(f"  card {i}: {_hint_text(card)}")
    for k in range(1, len(view.hands)):
        lines.append(f"Player +{k} (player {(player + k) % num_players}) hand:")
        for i, card in enumerate(view.hands[k]):
            lines.append(f"  card {i}: {card.color}{card.rank} ({_hint_text(card)})")
    lines.append(f"Last moves: {'; '.join(last_moves) or 'none'}.")
    return "\n".join(lines)


def describe_move(actor: int, label: str, num_players: int, viewer: int) -> str:
    """A past move in absolute player numbers, e.g. `player 1 told you: color R`."""
    inner = label.strip("()")
    who = "you" if actor == viewer else f"player {actor}"
    if inner.startswith("Reveal player +"):
        offset_text, _, what = inner[len("Reveal player +") :].partition(" ")
        target = (actor + int(offset_text)) % num_players if offset_text.isdigit() else -1
        whom = "you" if target == viewer else f"player {target}"
        return f"{who} told {whom}: {what}"
    if inner.startswith("Play "):
        return f"{who} played card {inner[5:]}"
    if inner.startswith("Discard "):
        return f"{who} discarded card {inner[8:]}"
    return f"{who}: {label}"
