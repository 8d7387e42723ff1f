"""Where independent policy-gradient learners settle in tiny Hanabi, computed exactly on the table.

    python docs/studies/tiny_hanabi/tiny_hanabi_tabular.py            # ~20 s on CPU

Two tabular softmax policies (player 0: card -> action; player 1: (card, partner's action) ->
action) follow the exact gradient of the expected shared return of OpenSpiel's `tiny_hanabi`
(payoff game A of the Bayesian Action Decoder paper; the best joint policy scores 10). No LLM:
this isolates the game's own trap from anything roll_ma does. Printed per setting: the final
return of each of ``--seeds`` runs from a near-uniform start and how many reach 10.

Settings: plain independent learners; a constant entropy bonus; an entropy bonus decayed
linearly to 0 over the first half of training (each player's own action entropy, at each of its
information sets, weighted by how often the set is reached).
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np


def payoff_table() -> np.ndarray:
    """(card0, card1, action0, action1) -> shared return, read from OpenSpiel."""
    import pyspiel

    game = pyspiel.load_game("tiny_hanabi")
    root = game.new_initial_state()
    table = np.zeros((2, 2, 3, 3))
    for c0, c1, a0, a1 in itertools.product(range(2), range(2), range(3), range(3)):
        table[c0, c1, a0, a1] = root.child(c0).child(c1).child(a0).child(a1).returns()[0]
    return table


def softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def entropy_grad(p: np.ndarray) -> np.ndarray:
    """d H(softmax(l)) / d l at probabilities ``p`` (last axis)."""
    h = -(p * np.log(p)).sum(-1, keepdims=True)
    return -p * (np.log(p) + h)


def train(table: np.ndarray, lr: float, steps: int, beta: float, decay: bool, seed: int) -> float:
    """Exact gradient ascent from a near-uniform start; returns the final expected return."""
    rng = np.random.default_rng(seed)
    logits0 = rng.normal(0.0, 0.1, (2, 3))  # player 0: card -> action logits
    logits1 = rng.normal(0.0, 0.1, (2, 3, 3))  # player 1: (card, partner action) -> action logits
    deal = 0.25  # each of the 4 (card0, card1) deals
    for t in range(steps):
        coef = beta * max(0.0, 1.0 - t / (steps / 2)) if decay else beta
        p0, p1 = softmax(logits0), softmax(logits1)
        # joint probability of (c0, c1, a0, a1): (2, 2, 3, 3)
        joint = deal * p0[:, None, :, None] * p1[None, :, :, :]
        weighted = joint * table
        # d E[R] / d logits of a softmax = sum over reached outcomes of prob * R * (onehot - p)
        g0 = weighted.sum((1, 3)) - p0 * weighted.sum((1, 2, 3))[:, None]
        g1 = weighted.sum(0) - p1 * weighted.sum((0, 3))[:, :, None]
        if coef > 0:
            # P(player 1 holds c1 and sees a0) = P(c1) * sum_c0 P(c0) p0(a0 | c0): (1, 3), same for both c1
            reach1 = deal * p0.sum(0)[None, :]
            g0 += coef * 0.5 * entropy_grad(p0)
            g1 += coef * reach1[:, :, None] * entropy_grad(p1)
        logits0 += lr * g0
        logits1 += lr * g1
    p0, p1 = softmax(logits0), softmax(logits1)
    return float((deal * p0[:, None, :, None] * p1[None, :, :, :] * table).sum())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--lr", type=float, default=0.5)
    args = p.parse_args()
    table = payoff_table()
    settings = [
        ("independent learners", 0.0, False),
        ("constant entropy bonus 2.0", 2.0, False),
        ("entropy bonus 1.0, decayed to 0 at half-way", 1.0, True),
        ("entropy bonus 2.0, decayed to 0 at half-way", 2.0, True),
    ]
    print(f"tiny_hanabi tabular exact policy gradient: lr {args.lr}, {args.steps} steps, {args.seeds} seeds")
    print("| setting | final returns (rounded) | runs at 10 |")
    print("|---|---|---|")
    for name, beta, decay in settings:
        finals = [train(table, args.lr, args.steps, beta, decay, s) for s in range(args.seeds)]
        rounded = sorted(round(f) for f in finals)
        counts = {v: rounded.count(v) for v in sorted(set(rounded), reverse=True)}
        at_ten = sum(f > 9.9 for f in finals)
        print(f"| {name} | {', '.join(f'{v}: {n}' for v, n in counts.items())} | {at_ten}/{args.seeds} |")


if __name__ == "__main__":
    main()
