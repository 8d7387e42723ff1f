"""Verdicts of the time-bounded verifier. No timing asserts: the verifier bounds each call."""

import threading

import pytest

from roll_ma.envs.math_verification import MathVerifier, as_plain_number, extract_boxed, normalize_answer

# (prediction, gold, expected verdict)
CASES = [
    # plain numbers and cheap normalisation: decided without math_verify
    ("85", "85", True),
    (" 85 ", "85", True),
    ("85.0", "85", True),
    ("085", "85", True),
    ("-3", "-3", True),
    ("- 3", "-3", True),
    ("84", "85", False),
    ("-85", "85", False),
    ("1,000", "1000", True),
    ("1000", "1,000", True),
    ("0.50", "0.5", True),
    (".5", "0.5", True),
    ("$42$", "42", True),
    ("42.", "42", True),
    ("\\text{42}", "42", True),
    ("\\left(1, 2\\right)", "(1,2)", True),
    ("\\dfrac{1}{2}", "\\frac{1}{2}", True),
    ("", "5", False),
    (None, "5", False),
    ("   ", "5", False),
    ("\uff18\uff15", "85", False),  # full-width digits are not ASCII numbers
    # equivalent forms: math_verify
    ("0.5", "\\frac{1}{2}", True),
    ("1/2", "0.5", True),
    ("\\frac12", "1/2", True),
    ("\\frac{3}{4}", "0.75", True),
    ("\\frac{2}{4}", "\\frac{1}{2}", True),
    ("1.5", "\\frac{3}{2}", True),
    ("\\frac{6}{2}", "3", True),
    ("3", "\\frac{6}{2}", True),
    ("\\sqrt{2}", "2^{1/2}", True),
    ("2\\sqrt{3}", "\\sqrt{12}", True),
    ("\\sqrt{2}", "\\sqrt{3}", False),
    ("x^2+2x+1", "(x+1)^2", True),
    ("(x+1)^2", "x^2+1", False),
    ("a+b", "b+a", True),
    ("2\\pi", "\\pi", False),
    ("\\pi", "\\pi", True),
    ("x=2", "2", True),
    ("\\infty", "\\infty", True),
    ("[1,2]", "[1, 2)", False),
    ("\\{1,2\\}", "\\{2,1\\}", True),
    ("\\frac{1}{3}", "\\frac{1}{4}", False),
    ("0.25", "\\frac{1}{3}", False),
    # a plain-number gold needs a number, not an expression (strict_numbers)
    ("37+48", "85", False),
    ("80+5", "85", False),
    ("2^{10}", "1024", False),
    ("90-5", "85", False),
    ("\\sin^2 x + \\cos^2 x", "1", False),
    # malformed
    ("{", "1", False),
    ("\\frac{1}{", "\\frac{1}{2}", False),
    ("}}}{{{", "\\frac{1}{2}", False),
    ("\\boxed{", "3", False),
    ("abc", "\\frac{1}{2}", False),
    ("1/0", "0.5", False),
    ("\\frac{1}{0}", "\\frac{1}{2}", False),
    ("x" * 600, "\\frac{1}{2}", False),
    ("\u0645\u0631\u062d\u0628\u0627 \U0001f600", "\\frac{1}{2}", False),
    # pathological: bounded by the verifier's own time limit
    ("9^{9^{9^{9}}}", "1", False),
    ("9^{9^{9^{9}}}", "\\frac{1}{3}", False),
]


def test_table_has_enough_cases():
    assert len(CASES) >= 50


@pytest.mark.parametrize("pred, gold, expected", CASES)
def test_verdicts(verifier, pred, gold, expected):
    result = verifier.verify(pred, gold)
    assert result.correct is expected, result


def test_methods(verifier):
    assert verifier.verify("85", "85").method == "exact"
    assert verifier.verify("85.0", "85").method == "numeric"
    assert verifier.verify("37+48", "85").method == "expression_for_number"
    assert verifier.verify("x" * 600, "\\frac{1}{2}").method == "too_long"
    assert verifier.verify("0.5", "\\frac{1}{2}").method == "math_verify"
    assert verifier.verify(None, "1").method == "empty"


def test_pathological_times_out_then_recovers():
    v = MathVerifier(timeout_s=1.0)
    try:
        assert v.verify("9^{9^{9^{9}}}", "\\frac{1}{3}").method == "timeout"
        assert v.counts["timeout"] == 1
        # the worker is restarted on the next slow-path call
        assert v.verify("0.5", "\\frac{1}{2}").correct
    finally:
        v.close()


def test_non_strict_numbers_lets_math_verify_decide():
    v = MathVerifier(strict_numbers=False)
    try:
        assert v.verify("2^{10}", "1024").correct
        assert v.verify("37+48", "85").correct
    finally:
        v.close()


def test_from_worker_threads(verifier):
    results = {}

    def work(i):
        results[i] = (verifier.verify("\\frac{1}{2}", "0.5").correct, verifier.verify("7", "8").correct)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: (True, False) for i in range(4)}


def test_extract_boxed():
    assert extract_boxed("so \\boxed{84} no, \\boxed{85}") == "85"
    assert extract_boxed("\\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_boxed("\\boxed{1} and \\boxed{2") == "1"  # the last COMPLETE box
    assert extract_boxed("\\boxed{\\boxed{3}}") == "\\boxed{3}"  # the box that closes last
    assert extract_boxed("no box") is None
    assert extract_boxed(None) is None
    assert extract_boxed("\\boxed{x" * 30_000) is None  # unclosed, linear time


def test_normalisation_helpers():
    assert normalize_answer(" \\dfrac{1}{2} ") == "\\frac{1}{2}"
    assert as_plain_number("1,234.5") == as_plain_number("1234.50")
    assert as_plain_number("1/2") is None and as_plain_number("1e3") is None
