"""Hanabi (OpenSpiel `hanabi`), 2-5 players, with MARS-style size presets.

Presets (hand size for 2-3 players; with 4-5 players it is one smaller, as in the official
rules, unless `hand_size` is given):

| preset   | colors | ranks | hand | info | life | max score |
|----------|--------|-------|------|------|------|-----------|
| mini     | 2      | 2     | 3    | 3    | 3    | 4         |
| simple   | 3      | 2     | 5    | 8    | 3    | 6         |
| full     | 3      | 3     | 5    | 8    | 3    | 9         |
| standard | 5      | 5     | 5    | 8    | 3    | 25        |

Action labels are OpenSpiel's: `(Play 0)`, `(Discard 1)`, `(Reveal player +1 color R)`,
`(Reveal player +1 rank 2)` (player +k = the k-th player after you).
"""

from __future__ import annotations

import random

from roll_ma.envs.hanabi_view import HanabiView, describe_move, parse_observation, render_view
from roll_ma.envs.openspiel_env import OpenSpielEnv

HANABI_PRESETS: dict[str, dict[str, int]] = {
    "mini": {"colors": 2, "ranks": 2, "hand_size": 3, "max_information_tokens": 3, "max_life_tokens": 3},
    "simple": {"colors": 3, "ranks": 2, "hand_size": 5, "max_information_tokens": 8, "max_life_tokens": 3},
    "full": {"colors": 3, "ranks": 3, "hand_size": 5, "max_information_tokens": 8, "max_life_tokens": 3},
    "standard": {"colors": 5, "ranks": 5, "hand_size": 5, "max_information_tokens": 8, "max_life_tokens": 3},
}


def hanabi_deck_size(colors: int, ranks: int) -> int:
    """Cards in the deck: per color three 1s, two of each middle rank, one top rank."""
    per_color = 3 if ranks == 1 else 3 + 2 * (ranks - 2) + 1
    return colors * per_color


def hanabi_config(
    players: int = 2,
    preset: str = "full",
    colors: int | None = None,
    ranks: int | None = None,
    hand_size: int | None = None,
    max_information_tokens: int | None = None,
    max_life_tokens: int | None = None,
) -> dict[str, int]:
    """OpenSpiel parameters of a Hanabi variant: a preset plus explicit overrides, validated."""
    if preset not in HANABI_PRESETS:
        raise ValueError(f"Unknown hanabi preset {preset!r}; choose one of {sorted(HANABI_PRESETS)}")
    if not 2 <= players <= 5:
        raise ValueError(f"hanabi needs 2-5 players, got players={players}")
    params = dict(HANABI_PRESETS[preset])
    if players >= 4:
        params["hand_size"] -= 1
    overrides = {
        "colors": colors,
        "ranks": ranks,
        "hand_size": hand_size,
        "max_information_tokens": max_information_tokens,
        "max_life_tokens": max_life_tokens,
    }
    params.update({k: int(v) for k, v in overrides.items() if v is not None})
    params["players"] = int(players)
    if not (1 <= params["colors"] <= 5 and 1 <= params["ranks"] <= 5):
        raise ValueError(
            f"hanabi colors and ranks must be in 1..5, got {params['colors']}, {params['ranks']}"
        )
    deck = hanabi_deck_size(params["colors"], params["ranks"])
    if params["hand_size"] < 1 or players * params["hand_size"] > deck:
        raise ValueError(
            f"hanabi preset {preset!r} with {players} players and hand_size={params['hand_size']} needs "
            f"{players * params['hand_size']} cards but the deck has {deck}; "
            f"pass hand_size<={deck // players}"
        )
    return params


class HanabiEnv(OpenSpielEnv):
    """Cooperative Hanabi; every player gets the same (team) reward.

    Args:
        players: Number of seats (2-5).
        preset: "mini", "simple", "full" or "standard" (see module docstring).
        colors, ranks, hand_size, max_information_tokens, max_life_tokens: Overrides.
        **kwargs: Common options of `OpenSpielEnv` (seat_agents, fallback, ...).
    """

    game_name = "hanabi"

    def __init__(
        self,
        *,
        players: int = 2,
        preset: str = "full",
        colors: int | None = None,
        ranks: int | None = None,
        hand_size: int | None = None,
        max_information_tokens: int | None = None,
        max_life_tokens: int | None = None,
        **kwargs,
    ):
        self.config = hanabi_config(
            players, preset, colors, ranks, hand_size, max_information_tokens, max_life_tokens
        )
        self.preset = preset
        super().__init__(**kwargs)

    def game_params(self) -> dict:
        return dict(self.config)

    def rules_prompt(self) -> str:
        c = self.config
        return (
            f"Hanabi, a cooperative card game for {c['players']} players with {c['colors']} colors and "
            f"ranks 1-{c['ranks']}. You see the other players' cards but not your own. Together build "
            f"each color's firework from 1 up to {c['ranks']}; the score is the number of cards played. "
            "On your turn do one of: Play a card (if it is not the next rank of its color you lose a "
            "life token), Discard a card (regains an info token), or Reveal to another player all their "
            "cards of one color or one rank (costs an info token). The game ends when the life tokens run "
            "out (score 0), when all fireworks are complete, or one round after the deck runs out. "
            f"Answer with one legal action, e.g. {self.parser.wrap('(Play 0)')}."
        )

    def view(self, state, player: int) -> HanabiView:
        """The parsed observation of `player`."""
        return parse_observation(state.observation_string(player))

    def render_observation(self, state, player: int) -> str:
        n = self.num_players
        recent = self.history[-(n - 1) :] if n > 1 else []
        moves = [describe_move(actor, label, n, player) for actor, label in recent]
        return render_view(
            self.view(state, player),
            player,
            n,
            self.config["max_information_tokens"],
            self.config["max_life_tokens"],
            self.config["colors"] * self.config["ranks"],
            moves,
        )

    def scripted_action(self, state, player: int, rng: random.Random) -> int:
        """Play a card known playable, else hint a playable card, else discard, else hint."""
        view = self.view(state, player)
        ids = {state.action_to_string(player, a): a for a in state.legal_actions()}
        own = view.hands[0] if view.hands else []
        for i, card in enumerate(own):
            cands = card.candidates()
            if cands and all(view.is_playable(c, r) for c, r in cands) and f"(Play {i})" in ids:
                return ids[f"(Play {i})"]
        if view.info_tokens > 0:
            for k in range(1, len(view.hands)):
                for card in view.hands[k]:
                    if card.color is None or card.rank is None or not view.is_playable(card.color, card.rank):
                        continue
                    if all(view.is_playable(c, r) for c, r in card.candidates()):
                        continue  # why: they already know it is playable
                    hints = [] if card.hinted_rank else [f"rank {card.rank}"]
                    hints += [] if card.hinted_color else [f"color {card.color}"]
                    for hint in hints:  # why: repeating a known hint would add nothing
                        label = f"(Reveal player +{k} {hint})"
                        if label in ids:
                            return ids[label]
        discards = [i for i in range(len(own)) if f"(Discard {i})" in ids]
        if discards:
            useless = [i for i in discards if all(view.is_useless(c, r) for c, r in own[i].candidates())]
            unhinted = [i for i in discards if own[i].hinted_color is None and own[i].hinted_rank is None]
            return ids[f"(Discard {(useless or unhinted or discards)[0]})"]
        reveals = [a for label, a in ids.items() if label.startswith("(Reveal")]
        return rng.choice(reveals) if reveals else rng.choice(list(ids.values()))

    def extra_metrics(self, state) -> dict[str, float]:
        view = self.view(state, 0)
        return {
            "score": float(state.returns()[0]),
            "fireworks": float(sum(view.fireworks.values())),
            "life_tokens_left": float(view.life_tokens),
        }
