"""Tiny Hanabi (OpenSpiel `tiny_hanabi`): a one-shot cooperative signalling game.

Chance deals each of the 2 players a private card d0/d1; player 0 picks a0/a1/a2 seeing its
card; player 1 picks seeing its card and player 0's action; both get the same payoff from a
fixed table (OpenSpiel's default is game A of the Bayesian Action Decoder paper).

The scripted policy is the optimal joint policy, found by exact search over the game itself
(see `optimal_policy`): for each of the 3^2 deterministic policies of player 0, player 1's
best reply is chosen independently at each of its information sets (card, action of player
0); the best pair is optimal because in a common-payoff game some deterministic joint policy
is optimal. With the default payoff the optimum is 10.0 (the game's max utility), e.g.
player 0 signals its card with its action and player 1 answers with the paying action.
"""

from __future__ import annotations

import itertools
import random
from typing import ClassVar

from roll_ma.envs.openspiel_env import OpenSpielEnv


class TinyHanabiEnv(OpenSpielEnv):
    """Tiny Hanabi for two seats. Actions are shown as `a0`, `a1`, `a2`.

    OpenSpiel's labels (`p0a1`) carry the player; the acting player is known, so the label
    drops it. Observations read e.g. `Player 1. Card d0. Partner chose a2.`

    Args:
        show_greedy_moves: SAD (Hu & Foerster, 2020): player 1 also sees the move player 0's
            policy takes greedily, `Partner chose a0, greedy a2.` (the `greedy_text` given to
            `step`; the chosen move where none was given, as at greedy evaluation or for a
            built-in opponent). Player 0's exploration then no longer blurs its signal.
        **kwargs: See `OpenSpielEnv`.
    """

    game_name = "tiny_hanabi"
    shows_greedy_moves = True
    # why: one search per process is enough; the table is fixed by the game parameters
    _optimal_cache: ClassVar[dict[str, tuple[float, dict, dict]]] = {}

    def __init__(self, *, show_greedy_moves: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.show_greedy_moves = bool(show_greedy_moves)

    def rules_prompt(self) -> str:
        # why: a ~1M-parameter model is trained on this: one short line
        choices = [self.parser.wrap(f"a{a}") for a in range(self.game.num_distinct_actions())]
        return f"Tiny Hanabi, shared score. Reply {', '.join(choices[:-1])} or {choices[-1]}."

    def render_observation(self, state, player: int) -> str:
        history = state.history()
        text = f"Player {player}. Card d{history[player]}."
        if player == 1:
            chosen = f"a{history[2]}"
            if self.show_greedy_moves:
                # why: the recorded greedy move belongs to this episode's state only (turn_at may
                # render any state); elsewhere the chosen move stands in, as under a greedy policy
                greedy = self.greedy_history[0] if state is self._state and self.greedy_history else None
                text += f" Partner chose {chosen}, greedy {greedy or chosen}."
            else:
                text += f" Partner chose {chosen}."
        return text

    def action_label(self, state, player: int, action: int) -> str:
        return f"a{action}"

    def scripted_action(self, state, player: int, rng: random.Random) -> int:
        _, policy0, policy1 = self.optimal_policy()
        history = state.history()
        if player == 0:
            return policy0[history[0]]
        return policy1[(history[1], history[2])]

    def optimal_policy(self) -> tuple[float, dict[int, int], dict[tuple[int, int], int]]:
        """Exact optimal joint policy by search over the game tree.

        Returns:
            (expected return, player 0 policy card -> action, player 1 policy
            (card, player 0 action) -> action).
        """
        key = str(self.game.get_parameters())
        if key not in self._optimal_cache:
            self._optimal_cache[key] = _search_optimal(self.game)
        return self._optimal_cache[key]


def _search_optimal(game) -> tuple[float, dict[int, int], dict[tuple[int, int], int]]:
    root = game.new_initial_state()
    deals = []  # (probability, card0, card1)
    for c0, p0 in root.chance_outcomes():
        s0 = root.child(c0)
        for c1, p1 in s0.chance_outcomes():
            deals.append((p0 * p1, c0, c1))
    num_actions = game.num_distinct_actions()
    payoff = {}
    for _, c0, c1 in deals:
        for a0, a1 in itertools.product(range(num_actions), repeat=2):
            state = root.child(c0).child(c1).child(a0).child(a1)
            payoff[(c0, c1, a0, a1)] = state.returns()[0]
    cards0 = sorted({c0 for _, c0, _ in deals})
    cards1 = sorted({c1 for _, _, c1 in deals})
    best: tuple[float, dict[int, int], dict[tuple[int, int], int]] = (float("-inf"), {}, {})
    for choice in itertools.product(range(num_actions), repeat=len(cards0)):
        policy0 = dict(zip(cards0, choice, strict=True))
        value, policy1 = 0.0, {}
        for c1, a0 in itertools.product(cards1, range(num_actions)):
            # why: player 1's information set is (its card, player 0's action); the deals
            # reaching it are those whose card0 makes player 0 play a0
            reach = [(p, c0) for p, c0, d1 in deals if d1 == c1 and policy0[c0] == a0]
            scores = [sum(p * payoff[(c0, c1, a0, a1)] for p, c0 in reach) for a1 in range(num_actions)]
            policy1[(c1, a0)] = max(range(num_actions), key=lambda a: (scores[a], -a))
            value += scores[policy1[(c1, a0)]]
        if value > best[0] + 1e-12:
            best = (value, policy0, policy1)
    return best
