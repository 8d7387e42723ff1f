import random

import pytest

from roll_ma.envs import make_env
from roll_ma.envs.math_selfplay import DEFAULT_SYSTEM_PROMPTS, MathSelfPlayEnv, extract_verdict

PROBLEM = {"problem": "37+48", "answer": "85"}


@pytest.fixture
def env(verifier):
    return MathSelfPlayEnv(verifier=verifier)


def _run(env, texts, problem=PROBLEM, seed=0):
    turn = env.reset(seed, problem=problem)
    turns, results = [turn], []
    for text in texts:
        result = env.step(text)
        results.append(result)
        if result.done:
            break
        turns.append(result.next_turn)
    return turns, results


def test_exact_rendering(env):
    turns, results = _run(env, ["\\boxed{84}", "  \\boxed{85} Incorrect\n", "\\boxed{85}"])
    assert turns[0].messages == [
        {"role": "system", "content": "You are the solver. Put the final answer in \\boxed{}."},
        {"role": "user", "content": "Problem: 37+48"},
    ]
    assert (
        turns[1].messages[0]["content"]
        == "You are the critic. Check the last answer and say Correct or Incorrect."
    )
    assert turns[2].messages == [
        {
            "role": "system",
            "content": "You are the refiner. Fix the answer if needed. Put the final answer in \\boxed{}.",
        },
        {"role": "user", "content": "Problem: 37+48\nSolver: \\boxed{84}\nCritic: \\boxed{85} Incorrect"},
    ]
    assert [(t.player, t.agent, t.legal_actions) for t in turns] == [
        (0, "solver", []),
        (1, "critic", []),
        (2, "refiner", []),
    ]
    assert results[-1].done and results[-1].next_turn is None


def test_critic_correct_ends_early(env):
    turns, results = _run(env, ["\\boxed{85}", "Looks Correct", "\\boxed{1}"])
    assert len(results) == 2 and results[1].done
    assert [r.rewards for r in results] == [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    assert env.episode_metrics()["ended_early"] == 1.0


def test_rounds_two_order(verifier):
    env = MathSelfPlayEnv(rounds=2, verifier=verifier)
    assert env.order == ["solver", "critic", "refiner", "critic", "refiner"]
    turns, results = _run(env, ["\\boxed{1}", "Incorrect", "\\boxed{2}", "Incorrect", "\\boxed{85}"])
    assert [t.agent for t in turns] == env.order and results[-1].done
    assert turns[4].messages[1]["content"] == (
        "Problem: 37+48\nSolver: \\boxed{1}\nCritic: Incorrect\nRefiner: \\boxed{2}\nCritic: Incorrect"
    )


def test_rewards_per_role_with_penalty(verifier):
    env = MathSelfPlayEnv(verifier=verifier, format_penalty=-0.5)
    # solver gives no boxed answer (format error), critic gives no verdict (format error, goes
    # on), refiner answers right
    _, results = _run(env, ["eighty-five", "hmm, not sure", "\\boxed{85}"])
    assert [r.rewards for r in results] == [[-0.5, 0.0, 0.0], [0.0, -0.5, 0.0], [0.0, 0.0, 1.0]]
    assert [r.info["format_error"] for r in results] == [True, True, False]
    assert results[1].info["verdict"] is None
    assert env.episode_returns() == [-0.5, -0.5, 1.0]
    # critic judging a missing answer: "Incorrect" is right
    _, results = _run(env, ["no answer", "Incorrect", "\\boxed{84}"])
    assert [r.rewards for r in results] == [[-0.5, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    # critic says Correct about a wrong answer: 0 for both, episode ends
    _, results = _run(env, ["\\boxed{84}", "Correct"])
    assert [r.rewards for r in results] == [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]] and results[-1].done
    # critic says Incorrect about a right answer: 0; the refiner keeps it right: 1
    _, results = _run(env, ["\\boxed{85}", "Incorrect", "\\boxed{85.0}"])
    assert [r.rewards for r in results] == [[1.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 1.0]]


def test_share_final_reward(verifier):
    env = MathSelfPlayEnv(verifier=verifier, share_final_reward=True)
    _, results = _run(env, ["\\boxed{84}", "Incorrect", "\\boxed{85}"])
    # own rewards 0, 1, 1; final answer right -> +1 for each of the 3 turns, paid on the last step
    assert [r.rewards for r in results] == [[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [1.0, 1.0, 2.0]]
    assert results[-1].info["turn_rewards"] == [1.0, 2.0, 2.0]
    assert results[-1].info["final_correct"] is True
    assert env.episode_returns() == [1.0, 2.0, 2.0]
    # final answer wrong: no bonus
    _, results = _run(env, ["\\boxed{85}", "Incorrect", "\\boxed{84}"])
    assert results[-1].rewards == [0.0, 0.0, 0.0] and results[-1].info["turn_rewards"] == [1.0, 0.0, 0.0]


def test_share_final_reward_counts_turns_per_player(verifier):
    env = MathSelfPlayEnv(verifier=verifier, share_final_reward=True, rounds=2)
    _, results = _run(env, ["\\boxed{84}", "Incorrect", "\\boxed{83}", "Incorrect", "\\boxed{85}"])
    # own: solver 0, critic 1 + 1, refiner 0 + 1; bonus 1 per turn: solver 1, critic 2, refiner 2
    assert results[-1].rewards == [1.0, 2.0, 3.0]
    assert env.episode_returns() == [1.0, 4.0, 3.0]
    assert results[-1].info["turn_rewards"] == [1.0, 2.0, 1.0, 2.0, 2.0]


def test_custom_names_kinds_prompts_and_shared_player(verifier):
    env = MathSelfPlayEnv(
        roles=["gen", "judge", "gen2"],
        role_kinds={"gen": "solver", "judge": "critic", "gen2": "refiner"},
        system_prompts={"judge": "Judge it."},
        verifier=verifier,
    )
    turns, _ = _run(env, ["\\boxed{84}", "Incorrect", "\\boxed{85}"])
    assert [t.agent for t in turns] == ["gen", "judge", "gen2"]
    assert turns[1].messages[0]["content"] == "Judge it."
    assert turns[2].messages[0]["content"] == DEFAULT_SYSTEM_PROMPTS["refiner"]
    assert turns[2].messages[1]["content"] == "Problem: 37+48\nSolver: \\boxed{84}\nCritic: Incorrect"
    same = MathSelfPlayEnv(
        roles=["alice", "bob", "alice"], role_kinds={"alice": "solver", "bob": "critic"}, verifier=verifier
    )
    assert same.num_players == 2 and same.seat_agents == ["alice", "bob"]
    turns, results = _run(same, ["\\boxed{1}", "Incorrect", "\\boxed{85}"])
    assert [t.player for t in turns] == [0, 1, 0] and results[-1].rewards == [1.0, 0.0]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"roles": ["critic", "solver"]}, "must be a solver"),
        ({"roles": ["solver", "judge"]}, "role 'judge' has kind 'judge', not one of solver, critic, refiner"),
        ({"rounds": 0}, "rounds"),
        ({"seat_agents": ["solver", "critic"], "roles": ["solver", "critic", "refiner"]}, "the seats"),
    ],
)
def test_bad_configs(kwargs, match, verifier):
    with pytest.raises(ValueError, match=match):
        MathSelfPlayEnv(verifier=verifier, **kwargs)


def test_same_seed_same_episode(verifier):
    problems = [{"problem": f"{i}+1", "answer": str(i + 1)} for i in range(100)]

    def episode(seed):
        env = make_env("math_selfplay", problems=problems, verifier=verifier)
        rng = random.Random(seed)
        turn, log = env.reset(seed), []
        while True:
            text = env.builtin_action("random", rng)
            result = env.step(text)
            log.append((turn.messages[1]["content"], text, tuple(result.rewards)))
            if result.done:
                return log, env.episode_metrics()
            turn = result.next_turn

    assert episode(3) == episode(3)
    assert len({episode(s)[0][0][0] for s in range(10)}) > 1  # seeds draw different problems
    env = make_env("math_selfplay", synthetic_level=3, verifier=verifier)
    assert env.reset(5).messages[1]["content"] == env.reset(5).messages[1]["content"]


def test_scripted_oracle_and_bad_texts(verifier):
    env = MathSelfPlayEnv(verifier=verifier)
    env.reset(0, problem=PROBLEM)
    result = env.step(env.builtin_action("scripted", random.Random(0)))
    assert result.info["correct"] is True
    assert env.step(env.builtin_action("scripted", random.Random(0))).info["verdict"] == "Correct"
    for text in [
        "",
        None,
        "x" * 100_000,
        "\\boxed{" * 10_000,
        "\U0001f600\u202e Correct? Incorrect!",
        "\\boxed{9^{9^{9^{9}}}}",
    ]:
        env.reset(0, problem=PROBLEM)
        result = env.step(text)
        assert result.rewards[0] in (0.0, 1.0)
        env.step(text)
    with pytest.raises(RuntimeError):
        env.reset(0, problem=PROBLEM)
        env.step("\\boxed{85}")
        env.step("Correct")
        env.step("too late")


def test_extract_verdict():
    assert extract_verdict("Correct") == "Correct"
    assert extract_verdict("Incorrect. Wait, Correct!") == "Correct"
    assert extract_verdict("Correct... no: Incorrect") == "Incorrect"
    assert extract_verdict("correct / INCORRECT / Correctness / Incorrectly") is None
    assert extract_verdict(None) is None


def test_episode_metrics(verifier):
    env = MathSelfPlayEnv(verifier=verifier, rounds=2)
    _run(env, ["\\boxed{84}", "Incorrect", "\\boxed{85}", "Incorrect", "\\boxed{84}"])
    m = env.episode_metrics()
    # answers 84 (wrong), 85 (right), 84 (wrong): majority 84 -> wrong; final 84 -> wrong
    assert (m["correct_turn1"], m["correct_final"], m["majority_correct"]) == (0.0, 0.0, 0.0)
    # critic 1: Incorrect on a wrong answer (tp); critic 2: Incorrect on a right answer (fp)
    assert (m["critic_tp"], m["critic_fp"], m["critic_fn"], m["critic_tn"]) == (1.0, 1.0, 0.0, 0.0)
    # refiner 1 fixed 84 -> 85; refiner 2 broke 85 -> 84
    assert (m["refiner_wrong_inputs"], m["refiner_right_inputs"], m["refiner_fixed"], m["refiner_broke"]) == (
        1.0,
        1.0,
        1.0,
        1.0,
    )
    _run(env, ["\\boxed{84}", "Incorrect", "\\boxed{85}", "Correct"])
    m = env.episode_metrics()
    # answers 84, 85: a tie, the latest (85) wins -> right
    assert (m["majority_correct"], m["correct_final"], m["ended_early"], m["critic_tn"]) == (
        1.0,
        1.0,
        1.0,
        1.0,
    )
