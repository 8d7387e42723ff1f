"""Kuhn poker and Leduc poker (OpenSpiel), two players, zero-sum, rendered as text.

Action labels are OpenSpiel's own (`Pass`/`Bet`; `Fold`/`Call`/`Raise`). The scripted
policy bets or calls with strong cards and checks or folds with weak ones.
"""

from __future__ import annotations

import random
import re

from roll_ma.envs.openspiel_env import OpenSpielEnv

_FIELD = re.compile(r"\[([^:\]]+): ([^\]]*)\]")
_ROUND = re.compile(r"\[Round (\d+)\]")
_KUHN_CARDS = "JQK"
_LEDUC_RANKS = "JQK"


class KuhnPokerEnv(OpenSpielEnv):
    """Kuhn poker: cards J < Q < K, one card each, one betting round."""

    game_name = "kuhn_poker"
    _PASS, _BET = 0, 1

    def rules_prompt(self) -> str:
        return (
            "Kuhn poker, 2 players, cards J < Q < K. Each player antes 1 chip and gets one card. "
            "Pass = check, or fold when facing a bet; Bet = bet 1 chip, or call a bet. "
            "If nobody folds, the higher card wins the pot. "
            f"Answer with {self.parser.wrap('Pass')} or {self.parser.wrap('Bet')}."
        )

    def render_observation(self, state, player: int) -> str:
        history = state.history()
        moves = history[2:]
        card = _KUHN_CARDS[history[player]] if history[player] < len(_KUHN_CARDS) else str(history[player])
        played = ", ".join(
            f"player {i % 2} {'Bet' if a == self._BET else 'Pass'}" for i, a in enumerate(moves)
        )
        pot = 2 + sum(1 for a in moves if a == self._BET)
        return f"You are player {player}. Your card: {card}. Pot: {pot}. Moves: {played or 'none yet'}."

    def scripted_action(self, state, player: int, rng: random.Random) -> int:
        history = state.history()
        card = history[player]
        facing_bet = self._BET in history[2:]
        top = self.num_players  # why: the deck has num_players + 1 cards; the top one never loses
        if card == top or (card == top - 1 and facing_bet):
            return self._BET  # bet with the best card; call a bet with the middle one
        return self._PASS


class LeducPokerEnv(OpenSpielEnv):
    """Leduc poker: 6 cards (J J Q Q K K), a private card each, a public card after round 1."""

    game_name = "leduc_poker"
    _FOLD, _CALL, _RAISE = 0, 1, 2

    def rules_prompt(self) -> str:
        w = self.parser.wrap
        return (
            "Leduc poker, 2 players, 6 cards: J J Q Q K K. Each player antes 1 chip and gets a private "
            "card; a public card is dealt after the first betting round. Two betting rounds, at most "
            "2 raises each (2 chips in round 1, 4 in round 2). Fold = give up the pot; Call = match the "
            "bet (or check); Raise = add a bet. At showdown a pair with the public card wins, else the "
            f"higher card. Answer with {w('Fold')}, {w('Call')} or {w('Raise')}."
        )

    def render_observation(self, state, player: int) -> str:
        info = state.information_state_string(player)
        fields = dict(_FIELD.findall(info))
        round_match = _ROUND.search(info)
        round_no = round_match.group(1) if round_match else "?"
        public = fields.get("Public")
        money = fields.get("Money", "").split()
        bets = {"0": "Fold", "1": "Call", "2": "Raise"}
        rounds = []
        for r in ("Round1", "Round2"):
            seq = [bets.get(a, a) for a in fields.get(r, "").split()]
            rounds.append(f"{r[:5]} {r[5:]} bets: {', '.join(seq) or 'none'}.")
        chips = ""
        if len(money) == 2:
            chips = f" Chips left: you {money[player]}, opponent {money[1 - player]}."
        return (
            f"You are player {player}. Your card: {self._card_name(fields.get('Private'))}. "
            f"Public card: {self._card_name(public) if public else 'not dealt yet'}. "
            f"Round {round_no} of 2. Pot: {fields.get('Pot', '?')}.{chips}\n" + " ".join(rounds)
        )

    def scripted_action(self, state, player: int, rng: random.Random) -> int:
        fields = dict(_FIELD.findall(state.information_state_string(player)))
        rank = int(fields["Private"]) // 2
        public = fields.get("Public")
        strength = 3 if public is not None and int(public) // 2 == rank else rank
        legal = state.legal_actions()
        if strength >= 2:
            return self._RAISE if self._RAISE in legal else self._CALL
        if strength == 0 and self._FOLD in legal:
            return self._FOLD  # why: Fold is only legal when facing a bet
        return self._CALL

    @staticmethod
    def _card_name(card: str | None) -> str:
        if card is None or not card.lstrip("-").isdigit() or int(card) < 0:
            return "none"
        # why: OpenSpiel numbers the 6 cards 0..5 with rank = card // 2 (checked at showdown)
        rank = int(card) // 2
        return _LEDUC_RANKS[rank] if rank < len(_LEDUC_RANKS) else f"card {card}"
