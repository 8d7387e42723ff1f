"""Tic-tac-toe (OpenSpiel), rendered as a 3x3 board; action labels like `x(1,2)` = (row, col)."""

from __future__ import annotations

import random

from roll_ma.envs.openspiel_env import OpenSpielEnv

_LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]
_CORNERS = (0, 2, 6, 8)


class TicTacToeEnv(OpenSpielEnv):
    """Tic-tac-toe; player 0 plays x, player 1 plays o. Scripted: win, block, center, corner."""

    game_name = "tic_tac_toe"

    def rules_prompt(self) -> str:
        return (
            "Tic-tac-toe on a 3x3 board. Players take turns marking a free cell; three marks in a "
            "row, column or diagonal win. Cells are (row,col) from 0. "
            f"Answer with one legal action, e.g. {self.parser.wrap('x(1,1)')}."
        )

    def render_observation(self, state, player: int) -> str:
        mark = "x" if player == 0 else "o"
        board = state.observation_string(player)
        return f"You play {mark}. Board ('.' = free):\n{board}"

    def scripted_action(self, state, player: int, rng: random.Random) -> int:
        cells = state.observation_string(player).replace("\n", "")
        mine, theirs = ("x", "o") if player == 0 else ("o", "x")
        legal = state.legal_actions()
        for mark in (mine, theirs):  # why: complete our own line first, else block theirs
            for line in _LINES:
                marks = [cells[i] for i in line]
                if marks.count(mark) == 2 and marks.count(".") == 1:
                    move = line[marks.index(".")]
                    if move in legal:
                        return move
        if 4 in legal:
            return 4
        corners = [c for c in _CORNERS if c in legal]
        return rng.choice(corners) if corners else rng.choice(legal)
