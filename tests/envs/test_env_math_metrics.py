import math

from roll_ma.envs import aggregate_math_metrics

E = dict  # one episode's metrics; missing keys count as 0
EPISODES = [
    # 1: solver right, critic Correct (tn), ends early
    E(correct_turn1=1, correct_final=1, majority_correct=1, critic_tn=1, turns=2),
    # 2: solver wrong, critic Incorrect (tp), refiner fixes it; majority: tie -> latest (right)
    E(
        correct_turn1=0,
        correct_final=1,
        majority_correct=1,
        critic_tp=1,
        refiner_wrong_inputs=1,
        refiner_fixed=1,
        turns=3,
    ),
    # 3: solver wrong, critic without verdict (format error), refiner wrong again
    E(
        correct_turn1=0,
        correct_final=0,
        majority_correct=0,
        critic_no_verdict=1,
        refiner_wrong_inputs=1,
        turns=3,
        format_errors=1,
    ),
    # 4: solver right, critic Incorrect (fp), refiner breaks it
    E(
        correct_turn1=1,
        correct_final=0,
        majority_correct=0,
        critic_fp=1,
        refiner_right_inputs=1,
        refiner_broke=1,
        turns=3,
    ),
    # 5: rounds=2: wrong, Incorrect (tp), same wrong, Incorrect (tp), right; majority: the wrong one (2 votes)
    E(
        correct_turn1=0,
        correct_final=1,
        majority_correct=0,
        critic_tp=2,
        refiner_wrong_inputs=2,
        refiner_fixed=1,
        turns=5,
    ),
    # 6 and 7: solver wrong, critic Correct (fn)
    E(correct_turn1=0, correct_final=0, majority_correct=0, critic_fn=1, turns=2),
    E(correct_turn1=0, correct_final=0, majority_correct=0, critic_fn=1, turns=2),
]


def test_aggregate_hand_table():
    m = aggregate_math_metrics(EPISODES)
    assert m["num_episodes"] == 7
    assert math.isclose(m["pass1@turn1"], 2 / 7)  # episodes 1, 4
    assert math.isclose(m["pass1@turnK"], 3 / 7)  # episodes 1, 2, 5
    assert math.isclose(m["maj1@turnK"], 2 / 7)  # episodes 1, 2
    # critic: tp = 1 + 2 = 3, fp = 1, fn = 2, tn = 1 -> 7 verdicts (the missing one is not a verdict)
    assert m["critic_verdicts"] == 7
    assert math.isclose(m["critic_precision"], 3 / 4)  # tp / (tp + fp)
    assert math.isclose(m["critic_recall"], 3 / 5)  # tp / (tp + fn)
    assert math.isclose(m["critic_accuracy"], 4 / 7)  # (tp + tn) / 7
    assert math.isclose(m["critic_always_correct_accuracy"], 2 / 7)  # (fp + tn) / 7
    assert math.isclose(m["critic_balanced_accuracy"], (3 / 5 + 1 / 2) / 2)  # (tp/(tp+fn) + tn/(tn+fp)) / 2
    # refiner: wrong inputs 1 + 1 + 2 = 4, fixed 1 + 1 = 2; right inputs 1, broke 1
    assert math.isclose(m["refiner_fix_rate"], 2 / 4)
    assert math.isclose(m["refiner_break_rate"], 1 / 1)
    assert math.isclose(m["format_error_rate"], 1 / 20)  # 1 error in 2+3+3+3+5+2+2 = 20 turns


def test_zero_denominators_are_left_out():
    assert aggregate_math_metrics([]) == {"num_episodes": 0.0}
    m = aggregate_math_metrics([E(correct_turn1=1, correct_final=1, majority_correct=1)])
    for key in (
        "critic_precision",
        "critic_recall",
        "critic_accuracy",
        "critic_balanced_accuracy",
        "refiner_fix_rate",
        "refiner_break_rate",
        "format_error_rate",
    ):
        assert key not in m
    assert m["critic_verdicts"] == 0 and m["pass1@turn1"] == 1.0
    assert all(not math.isnan(v) for v in m.values())
    # only false positives: precision 0 is a real value, recall has no positives -> left out
    m = aggregate_math_metrics([E(critic_fp=2)])
    assert m["critic_precision"] == 0.0 and "critic_recall" not in m
    assert "critic_balanced_accuracy" not in m  # one class only: no balanced accuracy
