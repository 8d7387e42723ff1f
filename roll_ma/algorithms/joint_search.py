"""Joint policy search over a small cooperative game's tree (JPS, Tian et al. 2020, simplest form).

Independent learners in a common-payoff game stop where no seat can do better alone: in tiny
Hanabi, player 0 keeps the safe `a1` with card d1 (9 of 10) because leaving it pays only once
player 1 answers the new signal the other way, which player 1 never learns while the signal is
never sent. A search over the game tree sees both halves at once: it forces other actions at one
or two information sets, lets every seat best-respond elsewhere, and keeps the joint policy that
gains most. The pipeline scores the adapters' current policy at every information set, searches from
its greedy version, and distills the result back into the adapters
(`roll_ma/pipelines/rl/joint_search_step.py`).

Pure functions over an enumerated tree: a list of terminal paths, each the chance probability,
the (information set, action index) of every decision on the way and the shared return.
Policies here are deterministic: information set -> action index.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

InfoSet = Hashable


@dataclass(frozen=True)
class TerminalPath:
    """One terminal history: chance probability, the decisions taken and the shared return."""

    chance: float
    moves: tuple[tuple[InfoSet, int], ...]  # (information set, action index) in play order
    value: float


@dataclass
class SearchResult:
    """What `joint_policy_search` found.

    Attributes:
        value_before: exact return of the starting joint policy.
        value_after: exact return of `policy` (== value_before when nothing improves).
        policy: the best joint policy found (every information set of the tree).
        changed: information sets whose action differs from the start, in tree order.
        deviation: the (information set, action) pairs forced before the players
            best-responded; None when best responses alone improved, or nothing did.
    """

    value_before: float
    value_after: float
    policy: dict[InfoSet, int]
    changed: list[InfoSet] = field(default_factory=list)
    deviation: tuple[tuple[InfoSet, int], ...] | None = None

    @property
    def improved(self) -> bool:
        return bool(self.changed)


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


def joint_policy_search(tree: GameTree, policy: Mapping[InfoSet, int], depth: int = 2,
                        min_gain: float = 1e-9, max_candidates: int = 200_000) -> SearchResult:
    """Best joint policy up to ``depth`` forced actions away from ``policy``, every player best-responding.

    Candidates: the players' best responses to ``policy`` as it is, and, for every set of up to
    ``depth`` information sets with another action forced at each, those actions kept while every
    player best-responds at its other information sets (in player order). Depth 2 matters: a
    signalling convention often pays only when a seat changes two moves together (tiny Hanabi's 9
    with the signal `a0` is 10 only once card d0 signals with `a2` and card d1 with `a0`). The
    candidate with the highest exact return wins if it beats ``policy`` by more than ``min_gain``;
    on ties the first one in that order. Candidates grow as (information sets x actions)^depth.
    """
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    start = {s: int(policy[s]) for s in tree.info_sets}
    before = tree.deterministic_value(start)
    players = sorted(set(tree.player_of.values()))
    best_value, best_policy, best_deviation = before, start, None

    def respond(candidate: dict[InfoSet, int], fixed: Collection[InfoSet]) -> dict[InfoSet, int]:
        for player in players:
            candidate = tree.best_response(candidate, player, fixed)
        return candidate

    moves = [(s, a) for s in tree.info_sets for a in range(tree.num_actions[s]) if a != start[s]]
    count = sum(math.comb(len(moves), k) for k in range(1, depth + 1))
    if count > max_candidates:
        raise ValueError(f"joint search at depth {depth} would try ~{count} candidates (more than "
                         f"{max_candidates}); lower the depth or search a smaller game")
    forced_sets = [()] + [combo for k in range(1, depth + 1) for combo in itertools.combinations(moves, k)
                          if len({s for s, _ in combo}) == k]
    for forced in forced_sets:
        candidate = respond({**start, **dict(forced)}, {s for s, _ in forced})
        value = tree.deterministic_value(candidate)
        if value > best_value + min_gain:
            best_value, best_policy, best_deviation = value, candidate, (forced or None)
    changed = [s for s in tree.info_sets if best_policy[s] != start[s]]
    return SearchResult(before, best_value if changed else before, best_policy, changed, best_deviation)
