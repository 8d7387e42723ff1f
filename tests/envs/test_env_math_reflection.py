"""The reflection game (actor answers, critic reviews, actor refines) and its metrics, scripted."""

from __future__ import annotations

import pytest

from roll_ma.envs.math_reflection import MathReflectionEnv
from roll_ma.envs.reflection_metrics import aggregate_reflection_metrics, episode_reflection_metrics

PROBLEM = {"problem": "37+48", "answer": "85"}


def play(env: MathReflectionEnv, texts: list[str], problem: dict = PROBLEM) -> list:
    turn = env.reset(0, problem=problem)
    results = []
    for text in texts:
        assert turn is not None, "the episode ended before the script did"
        result = env.step(text)
        results.append((turn, result))
        turn = result.next_turn
    assert turn is None, "the script ended before the episode did"
    return results


def script(answers: list[str], critique: str = "37+48=85 Incorrect") -> list[str]:
    """actor, critic, actor, ...: the answers boxed, the same critique between them."""
    out = []
    for i, a in enumerate(answers):
        if i:
            out.append(critique)
        out.append("\\boxed{" + a + "}")
    return out


@pytest.fixture
def env(verifier):
    return MathReflectionEnv(max_rounds=5, verifier=verifier)


def test_turn_order_prompts_and_rewards(env):
    results = play(env, script(["84", "85", "86", "85", "85"]))
    kinds = [r.info["kind"] for _, r in results]
    assert kinds == [
        "answer",
        "critique",
        "refine",
        "critique",
        "refine",
        "critique",
        "refine",
        "critique",
        "refine",
    ]
    assert [t.agent for t, _ in results] == ["actor", "critic"] * 4 + ["actor"]
    first, critic, refine = results[0][0], results[1][0], results[2][0]
    assert first.messages[1]["content"] == "Problem: 37+48"
    assert critic.messages[1]["content"] == "Problem: 37+48\nSolver: \\boxed{84}"
    assert refine.messages[1]["content"] == "Problem: 37+48\nSolver: \\boxed{84}\nCritic: 37+48=85 Incorrect"
    assert refine.messages[0]["content"].startswith("You are the refiner")
    # round 3's critic sees only the latest answer (history=last)
    assert results[5][0].messages[1]["content"] == "Problem: 37+48\nSolver: \\boxed{86}"
    # actor: 1 per right answer; critic: 1 when the refinement after its critique is right
    actor = [r.rewards[0] for _, r in results if r.info["kind"] != "critique"]
    critic_credit = [r.rewards[1] for _, r in results if r.info["kind"] == "refine"]
    assert actor == [0.0, 1.0, 0.0, 1.0, 1.0]
    assert critic_credit == [1.0, 0.0, 1.0, 1.0]
    assert env.episode_returns() == [3.0, 3.0]


def test_full_history_shows_every_turn(verifier):
    env = MathReflectionEnv(max_rounds=2, history="full", verifier=verifier)
    results = play(env, script(["84", "85"]))
    assert results[2][0].messages[1]["content"] == (
        "Problem: 37+48\nSolver: \\boxed{84}\nCritic: 37+48=85 Incorrect"
    )


def test_metrics_right_at_turn_three_only(env):
    """The issue's example: p1@t1 = 0, p1@t5 = 1, m1@t5 = 0 (five different answers: the tie goes to the
    latest, which is wrong)."""
    play(env, script(["80", "81", "85", "83", "84"]))
    m = env.episode_metrics()
    assert (m["p1@t1"], m["p1@t5"], m["m1@t5"]) == (0.0, 1.0, 0.0)
    assert [m[f"acc@t{i}"] for i in range(1, 6)] == [0.0, 0.0, 1.0, 0.0, 0.0]
    assert (m["fixed"], m["broke"], m["from_wrong"], m["from_right"]) == (1.0, 1.0, 3.0, 1.0)


def test_majority_and_first_answer(env):
    play(env, script(["85", "84", "85", "84", "85"]))  # 85 three times: the majority is right
    m = env.episode_metrics()
    assert (m["p1@t1"], m["m1@t5"], m["p1@t5"]) == (1.0, 1.0, 1.0)
    play(env, script(["84", "85", "84", "85", "84"]))  # 84 three times: wrong, though 85 came twice
    m = env.episode_metrics()
    assert (m["p1@t1"], m["m1@t5"], m["p1@t5"]) == (0.0, 0.0, 1.0)


def test_majority_tie_goes_to_latest_and_missing_answers_do_not_vote():
    # 84 and 85 twice each: the tie goes to the one seen last
    m = episode_reflection_metrics(["84", "85", "84", "85"], [False, True, False, True], 4)
    assert m["m1@t4"] == 1.0
    m = episode_reflection_metrics(["85", None, None, "84"], [True, False, False, False], 4)
    assert (m["p1@t1"], m["m1@t4"], m["p1@t4"]) == (1.0, 0.0, 1.0)


def test_aggregate_means_and_rates():
    eps = [
        episode_reflection_metrics(["1", "2"], [False, True], 2),
        episode_reflection_metrics(["2", "2"], [True, True], 2),
    ]
    agg = aggregate_reflection_metrics(eps)
    assert agg["num_episodes"] == 2 and agg["p1@t1"] == 0.5 and agg["p1@t2"] == 1.0 and agg["m1@t2"] == 1.0
    assert agg["fix_rate"] == 1.0 and agg["break_rate"] == 0.0


def test_branch_from_a_given_state(env):
    """A critic state: the history holds the first answer; two turns are played (critique, refinement)."""
    start = {**PROBLEM, "history": ["\\boxed{84}"], "horizon": 2}
    results = play(env, ["37+48=85 Incorrect", "\\boxed{85}"], problem=start)
    assert results[0][0].agent == "critic"
    assert results[0][0].messages[1]["content"] == "Problem: 37+48\nSolver: \\boxed{84}"
    assert results[1][1].rewards == [1.0, 1.0]
    m = env.episode_metrics()
    assert m["branch_success"] == 1.0 and m["turns"] == 2.0
    # an actor state: horizon 1, the refinement's context holds the given answer and critique
    start = {**PROBLEM, "history": ["\\boxed{84}", "37+48=84 Correct"], "horizon": 1}
    ((turn, result),) = play(env, ["\\boxed{84}"], problem=start)
    assert turn.messages[1]["content"].endswith("Critic: 37+48=84 Correct")
    assert result.rewards == [0.0, 0.0] and env.episode_metrics()["branch_success"] == 0.0


def test_bad_settings_are_refused(verifier):
    with pytest.raises(ValueError, match="max_rounds"):
        MathReflectionEnv(max_rounds=0)
    with pytest.raises(ValueError, match="history"):
        MathReflectionEnv(history="some")
    with pytest.raises(ValueError, match="two different agents"):
        MathReflectionEnv(roles=["a", "a"])
