"""Joint policy search over a small cooperative game's tree (JPS, Tian et al. 2020, simplest form).

Independent learners in a common-payoff game stop where no seat can do better alone: in tiny
Hanabi, player 0 keeps the safe `a1` with card d1 (9 of 10) because leaving it pays only once
player 1 answers the new signal the other way, which player 1 never learns while the signal is
never sent. A search over the game tree sees both halves at once: it forces other actions at one
or two information sets, lets every seat best-respond elsewhere, and keeps the joint policy that
gains most. The pipeline scores the adapters' current policy at every information set, searches from
its greedy version, and distills the result back into the adapters
(`roll_ma/studies/joint_search_step.py`).

A pure function over an enumerated tree (``roll_ma/algorithms/game_tree.py``, the core's: an env
describes its whole game there). Policies here are deterministic: information set -> action index.
"""


from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from roll_ma.algorithms.game_tree import GameTree, InfoSet


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
