"""Why the LM's tiny Hanabi seats stop at 8: a policy that shares its features across cards.

    python benchmarks/tiny_hanabi_shared_features.py            # ~20 s on one core

`tiny_hanabi_tabular.py` gives each card its own logits. An LM does not: "Card d0" and "Card d1"
differ by one digit of the prompt, and an update for one card moves the other almost as much
(`tiny_hanabi_policy.py` shows trained seats whose tables are the same for both cards). Here each
seat's logits are a card-blind part plus a card part that starts at 0 (the base model ignores the
card) and learns ``k`` times slower than the card-blind part (``k=1``: as free as a table). The
rest is what roll_ma does: 64 sampled episodes a step in groups of 8 sharing a deal, GRPO advantages
(mean and std within the group), an entropy bonus on each seat's action (as
`algorithm.action_entropy_coef`, decayed linearly to 0), Adam. Printed per setting: the exact
expected return of each seed's final policy and how many reach 10.
"""

from __future__ import annotations

import argparse

import numpy as np
from tiny_hanabi_tabular import entropy_grad, payoff_table, softmax

CARD_SIGN = np.array([1.0, -1.0])  # the card part enters as +u for d0 and -u for d1


def joint_policy(params: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(2, 3) player 0 card -> action, (2, 3, 3) player 1 (card, partner action) -> action."""
    p0 = softmax(params["blind0"][None, :] + CARD_SIGN[:, None] * params["card0"][None, :])
    p1 = softmax(params["blind1"][None] + CARD_SIGN[:, None, None] * params["card1"][None])
    return p0, p1


def train(table: np.ndarray, seed: int, k: float, beta: float, decay: int, steps: int,
          groups: int = 8, group_size: int = 8, lr: float = 0.05) -> float:
    """Sampled GRPO + Adam from a card-blind start; returns the final policy's exact expected return."""
    rng = np.random.default_rng(seed)
    params = {"blind0": rng.normal(0, 0.1, 3), "card0": np.zeros(3),
              "blind1": rng.normal(0, 0.1, (3, 3)), "card1": np.zeros((3, 3))}
    lrs = {"blind0": lr, "card0": k * lr, "blind1": lr, "card1": k * lr}
    moments = {n: (np.zeros_like(v), np.zeros_like(v)) for n, v in params.items()}
    rows = groups * group_size
    for t in range(1, steps + 1):
        coef = beta * max(0.0, 1.0 - (t - 1) / decay) if decay else beta
        p0, p1 = joint_policy(params)
        g0, g1 = np.zeros((2, 3)), np.zeros((2, 3, 3))  # gradients w.r.t. each card's logits
        for _ in range(groups):
            c0, c1 = rng.integers(2), rng.integers(2)  # the group's deal
            a0 = np.array([rng.choice(3, p=p0[c0]) for _ in range(group_size)])
            a1 = np.array([rng.choice(3, p=p1[c1, a]) for a in a0])
            returns = table[c0, c1, a0, a1]
            adv = (returns - returns.mean()) / (returns.std() + 1e-6)
            for x0, x1, a in zip(a0, a1, adv, strict=True):
                g0[c0] += (a * (np.eye(3)[x0] - p0[c0]) + coef * entropy_grad(p0[c0])) / rows
                g1[c1, x0] += (a * (np.eye(3)[x1] - p1[c1, x0]) + coef * entropy_grad(p1[c1, x0])) / rows
        grads = {"blind0": g0.sum(0), "card0": (CARD_SIGN[:, None] * g0).sum(0),
                 "blind1": g1.sum(0), "card1": (CARD_SIGN[:, None, None] * g1).sum(0)}
        for name, g in grads.items():  # Adam ascent
            m, v = moments[name]
            m[:] = 0.9 * m + 0.1 * g
            v[:] = 0.999 * v + 0.001 * g * g
            params[name] += lrs[name] * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
    p0, p1 = joint_policy(params)
    return float((0.25 * p0[:, None, :, None] * p1[None, :, :, :] * table).sum())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=6)
    p.add_argument("--steps", type=int, default=None, help="override every setting's steps (smoke runs)")
    args = p.parse_args()
    table = payoff_table()
    # (name, k, entropy bonus, decay steps, steps)
    settings = [
        ("independent cards (k=1), no bonus, 120 steps", 1.0, 0.0, 0, 120),
        ("shared features (k=0.3), no bonus, 120 steps", 0.3, 0.0, 0, 120),
        ("k=0.3, bonus 1.0 decayed over 60 of 120 steps", 0.3, 1.0, 60, 120),
        ("k=0.3, bonus 1.0 decayed over 160 of 220 steps", 0.3, 1.0, 160, 220),
        ("k=0.1, bonus 1.0 decayed over 160 of 220 steps", 0.1, 1.0, 160, 220),
        ("k=0.3, bonus 1.0 decayed over 300 of 400 steps", 0.3, 1.0, 300, 400),
        ("k=0.1, bonus 1.0 decayed over 450 of 600 steps", 0.1, 1.0, 450, 600),
    ]
    print(f"tiny_hanabi, sampled GRPO + Adam, 64 episodes a step, {args.seeds} seeds")
    print("| setting | final returns (one decimal) | runs at 10 |")
    print("|---|---|---|")
    for name, k, beta, decay, steps in settings:
        steps = args.steps or steps
        finals = [train(table, seed, k, beta, min(decay, steps), steps) for seed in range(args.seeds)]
        shown = ", ".join(f"{f:.1f}" for f in sorted(finals))
        print(f"| {name} | {shown} | {sum(f > 9.5 for f in finals)}/{args.seeds} |", flush=True)


if __name__ == "__main__":
    main()
