import itertools
import random

from roll_ma.envs import make_env


def test_optimal_policy_reaches_10():
    env = make_env("tiny_hanabi")
    value, policy0, policy1 = env.optimal_policy()
    assert value == 10.0 == env.max_utility
    # the scripted (optimal) players score 10 on every deal
    for seed in range(50):
        env.reset(seed)
        while not env.step(env.builtin_action("scripted", random.Random(0))).done:
            pass
        assert env.state.returns() == [10.0, 10.0]


def test_optimal_value_is_best_over_all_deterministic_joint_policies():
    """Cross-check the search with a brute force over all 9 * 729 joint policies, by simulation."""
    env = make_env("tiny_hanabi")
    game = env.game
    payoff = {}
    for c0, c1, a0, a1 in itertools.product(range(2), range(2), range(3), range(3)):
        payoff[(c0, c1, a0, a1)] = (
            game.new_initial_state().child(c0).child(c1).child(a0).child(a1).returns()[0]
        )
    best = max(
        sum(payoff[(c0, c1, p0[c0], p1[c1 * 3 + p0[c0]])] for c0 in range(2) for c1 in range(2)) / 4
        for p0 in itertools.product(range(3), repeat=2)
        for p1 in itertools.product(range(3), repeat=6)
    )
    assert best == 10.0


def test_rendering_is_short_and_parses_back():
    env = make_env("tiny_hanabi", seat_agents=["a", "b"])
    turn = env.reset(0)
    system = turn.messages[0]["content"]
    assert "\n" not in system and len(system) < 120
    assert turn.legal_actions == ["a0", "a1", "a2"]
    assert (
        turn.messages[1]["content"] == f"Player 0. Card d{env.state.history()[0]}.\nLegal actions: a0, a1, a2"
    )
    result = env.step("<answer>a2</answer>")
    assert result.info["action"] == "a2" and env.state.history()[2] == 2
    assert result.next_turn.messages[1]["content"].startswith("Player 1. Card d")
    assert "Partner chose a2." in result.next_turn.messages[1]["content"]
    # OpenSpiel's own label is not accepted: the env speaks a0/a1/a2
    assert env.step("<answer>p1a0</answer>").info["format_error"]


def test_greedy_moves_are_shown_to_the_partner_only_when_asked():
    env = make_env("tiny_hanabi", seat_agents=["a", "b"], show_greedy_moves=True)
    env.reset(0)
    turn = env.step("<answer>a0</answer>", greedy_text="<answer>a2</answer>").next_turn
    assert "Partner chose a0, greedy a2." in turn.messages[1]["content"]
    env.step("<answer>a1</answer>", greedy_text="<answer>a1</answer>")
    assert env.episode_metrics()["greedy_agreement"] == 0.5  # player 0 explored, player 1 did not
    # no greedy answer (greedy evaluation, a built-in opponent) or an unparseable one: the chosen move
    env.reset(0)
    turn = env.step("<answer>a1</answer>", greedy_text="no answer here").next_turn
    assert "Partner chose a1, greedy a1." in turn.messages[1]["content"]
    assert "greedy_agreement" not in env.episode_metrics()
    # another state (inspection through turn_at) never borrows this episode's greedy move
    env.reset(0)
    env.step("<answer>a0</answer>", greedy_text="<answer>a2</answer>")
    other = env.game.new_initial_state()
    for action in env.state.history()[:2] + [1]:  # the same deal, player 0 chose a1
        other.apply_action(action)
    assert "Partner chose a1, greedy a1." in env.turn_at(other).messages[1]["content"]
    # off by default: the plain observation, and step takes greedy_text without showing it
    plain = make_env("tiny_hanabi", seat_agents=["a", "b"])
    plain.reset(0)
    turn = plain.step("<answer>a0</answer>", greedy_text="<answer>a2</answer>").next_turn
    assert turn.messages[1]["content"].split("\n")[0].endswith("Partner chose a0.")
