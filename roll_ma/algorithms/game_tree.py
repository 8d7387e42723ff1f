"""A small cooperative game's whole tree, enumerated: what an env with ``game_tree()`` describes
(``envs/base.py: GameTreeEnv``) and the exact values over it.

A list of terminal paths, each the chance probability, the (information set, action index) of every
decision on the way and the shared return. Policies are information set -> action index (deterministic)
or -> probabilities; ``value`` is a policy's exact expected return and ``best_response`` a seat's best
answer to the others. The studies' joint policy search (``roll_ma/studies/joint_policy_search.py``) searches
over it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

InfoSet = Hashable


@dataclass(frozen=True)
class TerminalPath:
    """One terminal history: chance probability, the decisions taken and the shared return."""

    chance: float
    moves: tuple[tuple[InfoSet, int], ...]  # (information set, action index) in play order
    value: float



class GameTree:
    """The paths of a game and, per information set, its player and number of actions.

    Args:
        paths: every terminal history (chance probabilities summing to 1).
        player_of: information set -> the player who acts there.
        num_actions: information set -> number of legal actions there.
    """

    def __init__(self, paths: Sequence[TerminalPath], player_of: Mapping[InfoSet, int],
                 num_actions: Mapping[InfoSet, int]):
        self.paths = list(paths)
        self.player_of = dict(player_of)
        self.num_actions = dict(num_actions)
        self.info_sets = list(self.player_of)  # tree order (first visit)
        self.through: dict[InfoSet, list[int]] = defaultdict(list)  # info set -> paths that visit it
        depth: dict[InfoSet, int] = {}
        for n, path in enumerate(self.paths):
            for d, (info_set, action) in enumerate(path.moves):
                if info_set not in self.player_of:
                    raise ValueError(f"path {n} visits {info_set!r}, which has no player")
                if not 0 <= action < self.num_actions[info_set]:
                    raise ValueError(f"path {n} takes action {action} at {info_set!r} "
                                     f"(it has {self.num_actions[info_set]})")
                if not self.through[info_set] or self.through[info_set][-1] != n:
                    self.through[info_set].append(n)
                depth[info_set] = max(depth.get(info_set, 0), d)
        # best responses sweep the deepest information sets first (backward induction order)
        self._deepest_first = sorted(self.info_sets, key=lambda s: -depth.get(s, 0))

    def value(self, policy: Mapping[InfoSet, Sequence[float] | np.ndarray]) -> float:
        """Exact expected return of a stochastic joint policy (information set -> action probabilities)."""
        total = 0.0
        for path in self.paths:
            reach = path.chance
            for info_set, action in path.moves:
                reach *= float(policy[info_set][action])
            total += reach * path.value
        return total

    def deterministic_value(self, policy: Mapping[InfoSet, int]) -> float:
        return sum(p.chance * p.value for p in self.paths if all(policy[s] == a for s, a in p.moves))

    def action_values(self, policy: Mapping[InfoSet, int], info_set: InfoSet) -> list[float]:
        """Return reached through ``info_set`` per action of it, the other decisions as in ``policy``."""
        values = [0.0] * self.num_actions[info_set]
        for n in self.through[info_set]:
            path = self.paths[n]
            taken = {a for s, a in path.moves if s == info_set}
            if len(taken) == 1 and all(policy[s] == a for s, a in path.moves if s != info_set):
                values[taken.pop()] += path.chance * path.value
        return values

    def best_response(self, policy: Mapping[InfoSet, int], player: int, fixed: Collection[InfoSet] = (),
                      max_sweeps: int = 20) -> dict[InfoSet, int]:
        """``player``'s best reply to the others' actions in ``policy`` (deepest information sets first).

        Information sets in ``fixed`` keep their action. An action changes only when it is strictly
        better, so ties and unreached information sets keep the action they had.
        """
        policy = dict(policy)
        mine = [s for s in self._deepest_first if self.player_of[s] == player and s not in fixed]
        for _ in range(max_sweeps):
            moved = False
            for info_set in mine:
                values = self.action_values(policy, info_set)
                best = max(range(len(values)), key=lambda a: values[a])
                if values[best] > values[policy[info_set]] + 1e-12:
                    policy[info_set] = best
                    moved = True
            if not moved:
                break
        return policy
