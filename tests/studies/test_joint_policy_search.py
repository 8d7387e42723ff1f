"""Joint policy search on tiny Hanabi's tree and on hand-made trees.

Tiny Hanabi's payoff (OpenSpiel's default, game A of the BAD paper): a1 pays 8 when answered a1,
else 4; a signal (a0/a2) pays 10 when player 1 answers a0 for equal cards and a2 for different
ones, except that a2 from card d1 pays 0 whenever the cards differ. So:
- "8": everybody plays a1 -> 8.
- "9": player 0 signals d0 with a2 and keeps a1 with d1; player 1 reads a2 as "partner has d0"
  -> (10 + 8) / 2 = 9. No single seat can do better alone.
- "10": player 0 d0 -> a2, d1 -> a0; player 1 answers its card XOR the signal -> 10.
"""

import itertools
import random

import pytest

from roll_ma.algorithms.game_tree import GameTree, TerminalPath
from roll_ma.envs.tiny_hanabi import TinyHanabiEnv
from roll_ma.studies.joint_policy_search import joint_policy_search

pytest.importorskip("pyspiel")


@pytest.fixture(scope="module")
def hanabi():
    env = TinyHanabiEnv()
    tree, turns = env.game_tree()
    return env, tree, turns


def info_set(turns, player, card, partner=None):
    """The key of the information set whose prompt starts with that observation line."""
    seen = f"Player {player}. Card d{card}." + (f" Partner chose a{partner}." if partner is not None else "")
    (key,) = [k for k, t in turns.items() if t.messages[-1]["content"].split("\n")[0] == seen]
    return key


def joint(turns, p0: dict, p1: dict) -> dict:
    policy = {info_set(turns, 0, c): a for c, a in p0.items()}
    policy.update({info_set(turns, 1, c, s): a for (c, s), a in p1.items()})
    return policy


NINE = ({0: 2, 1: 1}, {(0, 0): 0, (0, 1): 1, (0, 2): 0, (1, 0): 2, (1, 1): 1, (1, 2): 2})
TEN = ({0: 2, 1: 0}, {(0, 0): 2, (0, 1): 1, (0, 2): 0, (1, 0): 0, (1, 1): 1, (1, 2): 2})
EIGHT = ({0: 1, 1: 1}, {(c, s): 1 for c in range(2) for s in range(3)})


def test_tree_has_every_deal_and_information_set(hanabi):
    env, tree, turns = hanabi
    assert len(tree.paths) == 4 * 3 * 3  # deals x player 0's moves x player 1's moves
    assert sum(p.chance for p in tree.paths) / 9 == pytest.approx(1.0)
    assert sorted(t.player for t in turns.values()) == [0, 0] + [1] * 6
    assert all(t.legal_actions == ["a0", "a1", "a2"] for t in turns.values())


def test_values_of_known_joint_policies(hanabi):
    env, tree, turns = hanabi
    assert tree.deterministic_value(joint(turns, *EIGHT)) == pytest.approx(8.0)
    assert tree.deterministic_value(joint(turns, *NINE)) == pytest.approx(9.0)
    assert tree.deterministic_value(joint(turns, *TEN)) == pytest.approx(10.0)
    assert env.optimal_policy()[0] == pytest.approx(10.0)


def test_stochastic_value_matches_the_payoff_table(hanabi):
    env, tree, turns = hanabi
    rng = random.Random(0)
    policy = {}
    for key in turns:
        w = [rng.random() for _ in range(3)]
        policy[key] = [x / sum(w) for x in w]
    root = env.game.new_initial_state()
    expected = 0.0
    for c0, c1, a0, a1 in itertools.product(range(2), range(2), range(3), range(3)):
        prob = 0.25 * policy[info_set(turns, 0, c0)][a0] * policy[info_set(turns, 1, c1, a0)][a1]
        expected += prob * root.child(c0).child(c1).child(a0).child(a1).returns()[0]
    assert tree.value(policy) == pytest.approx(expected)


def test_search_leaves_the_nine_for_ten_in_one_joint_move(hanabi):
    _, tree, turns = hanabi
    result = joint_policy_search(tree, joint(turns, *NINE))
    assert (result.value_before, result.value_after) == (pytest.approx(9.0), pytest.approx(10.0))
    # player 0 sends a0 with card d1 and player 1 reads it the other way from a2: exactly these three
    assert set(result.changed) == {info_set(turns, 0, 1), info_set(turns, 1, 0, 0), info_set(turns, 1, 1, 0)}
    assert result.policy == joint(turns, *TEN)


def test_search_from_the_optimum_changes_nothing(hanabi):
    _, tree, turns = hanabi
    result = joint_policy_search(tree, joint(turns, *TEN))
    assert not result.improved and result.value_after == result.value_before == pytest.approx(10.0)
    assert result.policy == joint(turns, *TEN)


def test_search_from_the_safe_eight(hanabi):
    _, tree, turns = hanabi
    one = joint_policy_search(tree, joint(turns, *EIGHT), depth=1)
    # one forced move signals one card
    assert (one.value_before, one.value_after) == (pytest.approx(8.0), pytest.approx(9.0))
    assert tree.deterministic_value(one.policy) == pytest.approx(one.value_after)
    two = joint_policy_search(tree, joint(turns, *EIGHT), depth=2)
    assert two.value_after == pytest.approx(10.0) and len(two.deviation) == 2


def test_the_nine_that_signals_with_a0_needs_two_forced_moves(hanabi):
    _, tree, turns = hanabi
    nine_a0 = ({0: 0, 1: 1}, NINE[1])  # card d0 signals with a0: sending a0 from d1 as well pays nothing
    assert tree.deterministic_value(joint(turns, *nine_a0)) == pytest.approx(9.0)
    assert not joint_policy_search(tree, joint(turns, *nine_a0), depth=1).improved
    result = joint_policy_search(tree, joint(turns, *nine_a0), depth=2)
    assert result.value_after == pytest.approx(10.0) and result.policy == joint(turns, *TEN)
    with pytest.raises(ValueError, match="candidates"):
        joint_policy_search(tree, joint(turns, *nine_a0), depth=3, max_candidates=100)


def test_best_response_alone_counts_as_a_candidate():
    # one player, one decision: action 1 pays more; no deviation of another player needed
    paths = [TerminalPath(1.0, (("s", 0),), 1.0), TerminalPath(1.0, (("s", 1),), 3.0)]
    tree = GameTree(paths, {"s": 0}, {"s": 2})
    result = joint_policy_search(tree, {"s": 0})
    assert result.policy == {"s": 1} and result.deviation is None and result.value_after == 3.0
    with pytest.raises(ValueError, match="depth must be"):
        joint_policy_search(tree, {"s": 0}, depth=0)


def test_best_response_goes_deepest_first():
    # player 1 moves twice (x then y); y's best action depends on x being 1, which pays only with y = 1
    paths = [TerminalPath(1.0, (("x", x), ("y", y)), v) for (x, y), v in
             {(0, 0): 2.0, (0, 1): 0.0, (1, 0): 0.0, (1, 1): 5.0}.items()]
    tree = GameTree(paths, {"x": 1, "y": 1}, {"x": 2, "y": 2})
    assert tree.best_response({"x": 1, "y": 0}, player=1) == {"x": 1, "y": 1}
    assert tree.best_response({"x": 0, "y": 0}, player=1) == {"x": 0, "y": 0}  # a local optimum stays


def test_tree_checks_its_paths():
    with pytest.raises(ValueError, match="takes action 2"):
        GameTree([TerminalPath(1.0, (("s", 2),), 1.0)], {"s": 0}, {"s": 2})
    with pytest.raises(ValueError, match="has no player"):
        GameTree([TerminalPath(1.0, (("t", 0),), 1.0)], {"s": 0}, {"s": 2})


def test_game_tree_refuses_what_it_cannot_search():
    from roll_ma.envs.poker import KuhnPokerEnv

    with pytest.raises(ValueError, match="common-payoff"):
        KuhnPokerEnv().game_tree()
    with pytest.raises(ValueError, match="greedy moves"):
        TinyHanabiEnv(show_greedy_moves=True).game_tree()
    with pytest.raises(ValueError, match="small games"):
        TinyHanabiEnv().game_tree(max_paths=10)
