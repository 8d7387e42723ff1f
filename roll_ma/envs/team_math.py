"""The built-in task of the ``marft`` team env: one math problem, the last agent's answer is graded.

The protocol every ``env.path`` task follows (siiRL's multi-agent env)::

    reset(problem: dict) -> str                                  # the first observation
    step(actions: dict[str, str], ground_truth: str) -> (obs: str, reward: float, done: bool)
    metrics() -> dict[str, float]                                # optional: this episode's numbers

``actions`` maps each agent's name to what it answered this round, in speaking order.
"""

from __future__ import annotations

from roll_ma.envs.math_verification import MathVerifier, extract_boxed, get_default_verifier


class MathTask:
    """Reward 1.0 when the round's last answer's ``\\boxed{}`` equals the ground truth, else 0.0; one round.

    Args:
        prefix: text before the problem in the observation (the tiny model was trained on 'Problem: ').
        verifier: a ``MathVerifier``; default: the shared one of this process.
    """

    def __init__(self, prefix: str = "Problem: ", verifier: MathVerifier | None = None):
        self.prefix = prefix
        self._verifier = verifier
        self._correct = self._answered = 0.0

    def reset(self, problem: dict) -> str:
        self._correct = self._answered = 0.0
        return self.prefix + str(problem["problem"])

    def step(self, actions: dict[str, str], ground_truth: str) -> tuple[str, float, bool]:
        last = list(actions.values())[-1] if actions else ""
        answer = extract_boxed(last)
        verifier = self._verifier or get_default_verifier()
        self._correct = float(verifier.verify(answer, str(ground_truth)).correct)
        self._answered = float(answer is not None)
        return "", self._correct, True

    def metrics(self) -> dict[str, float]:
        return {"correct": self._correct, "answered": self._answered}
