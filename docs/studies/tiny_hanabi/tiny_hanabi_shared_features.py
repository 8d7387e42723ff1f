"""Why the LM's tiny Hanabi seats stop at 8 or 9: a policy that shares its features across cards and signals.

    python docs/studies/tiny_hanabi/tiny_hanabi_shared_features.py            # ~1 min on one core

`tiny_hanabi_tabular.py` gives each information set its own logits. An LM does not: "Card d0"
and "Card d1" differ by one digit of the prompt, and an update for one card moves the other
almost as much (`tiny_hanabi_card_tie.py`); so do "Partner chose a0" and "Partner chose a2" for
player 1 (the signal tie). Here each seat's logits are a shared part plus a card part that starts
at 0 (the base ignores the card) and learns ``k`` times slower than the shared part (``k=1``: as
free as a table). With ``k_sig`` set, player 1's logits also share a part across the partner's
actions, and the part that depends on the action learns ``k_sig`` times slower; without it each
partner action has its own logits. ``shown`` gives player 1 one more public input, through
parts that learn as slowly as the signal part: ``"greedy"``, the Simplified Action Decoder's
(`env.show_greedy_moves`: player 0's greedy action), or ``"belief"``, the Bayesian Action
Decoder's public belief in its simplest form (player 0's move is drawn for both cards, a plan,
and player 1 is told the partner's card whenever the plan tells the two apart).
``partner_samples`` > 1 draws several answers of player 1 to each move of player 0 and credits
the move with mean + ``optimism`` x (max - mean) of their returns (lenient / optimistic
learners: a move counts as good if the partner can answer it well). The rest is what roll_ma
does: 64 sampled episodes a step in groups of 8 sharing a deal, GRPO advantages (mean and std
within the group), an entropy bonus on each seat's action (as `study.action_entropy_coef`,
decayed linearly to 0), Adam. Printed per setting: the exact expected return of each seed's
final policy and how many reach 10.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

import numpy as np
from tiny_hanabi_tabular import entropy_grad, payoff_table, softmax

CARD_SIGN = np.array([1.0, -1.0])  # a card part enters as +u for d0 and -u for d1


@dataclass(frozen=True)
class Setting:
    name: str
    k: float  # card parts' learning-rate factor
    beta: float  # entropy bonus at step 1
    decay: int  # steps over which the bonus falls to 0 (0: constant)
    steps: int
    k_sig: float | None = None  # signal parts' factor; None: player 1 has logits per partner action
    k_inter: float | None = None  # player 1's card x signal part's factor (default k * k_sig)
    shown: str | None = None  # player 1's extra public input: None, "greedy" (SAD) or "belief" (BAD)
    partner_samples: int = 1  # answers of player 1 drawn for each move of player 0
    optimism: float = 0.0  # player 0's credit: mean + optimism * (max - mean) over those answers


def init_params(rng: np.random.Generator, s: Setting) -> tuple[dict, dict]:
    """Parameters and their learning-rate factors; card and signal parts start at 0."""
    params = {"blind0": rng.normal(0, 0.1, 3), "card0": np.zeros(3)}
    rates = {"blind0": 1.0, "card0": s.k}
    if s.k_sig is None:  # (partner action, answer) tables: no sharing across signals
        params |= {"blind1": rng.normal(0, 0.1, (3, 3)), "card1": np.zeros((3, 3))}
        rates |= {"blind1": 1.0, "card1": s.k}
        return params, rates
    params |= {"blind1": rng.normal(0, 0.1, 3), "card1": np.zeros(3),
               "signal1": np.zeros((3, 3)), "card_signal1": np.zeros((3, 3))}
    inter = s.k * s.k_sig if s.k_inter is None else s.k_inter
    rates |= {"blind1": 1.0, "card1": s.k, "signal1": s.k_sig, "card_signal1": inter}
    if s.shown:
        params |= {"shown1": np.zeros((3, 3)), "card_shown1": np.zeros((3, 3))}
        rates |= {"shown1": s.k_sig, "card_shown1": s.k * s.k_sig}
    return params, rates


def joint_policy(params: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(2, 3) player 0 card -> action; its greedy action per card (2,); (2, 3, 3, 3) player 1
    (card, partner action, shown input) -> answer. The shown input is the partner's greedy action
    (SAD) or its card as the public belief tells it (BAD: d0, d1, or 2 for either)."""
    p0 = softmax(params["blind0"][None, :] + CARD_SIGN[:, None] * params["card0"][None, :])
    sign = CARD_SIGN[:, None, None]
    if params["blind1"].ndim == 2:
        logits1 = params["blind1"][None] + sign * params["card1"][None]  # (card, action, answer)
    else:
        blind = params["blind1"] + params["signal1"]  # (action, answer)
        logits1 = blind[None] + sign * (params["card1"] + params["card_signal1"])[None]
    logits1 = np.repeat(logits1[:, :, None, :], 3, axis=2)  # (card, action, shown input, answer)
    if "shown1" in params:
        shown = params["shown1"][None, None] + sign[..., None] * params["card_shown1"][None, None]
        logits1 = logits1 + shown
    return p0, p0.argmax(1), softmax(logits1)


def parameter_grads(g0: np.ndarray, g1: np.ndarray, params: dict) -> dict[str, np.ndarray]:
    """Chain rule from the per-information-set logit gradients to each part."""
    sign = CARD_SIGN[:, None, None, None]
    grads = {"blind0": g0.sum(0), "card0": (CARD_SIGN[:, None] * g0).sum(0)}
    if params["blind1"].ndim == 2:
        grads |= {"blind1": g1.sum((0, 2)), "card1": (sign * g1).sum((0, 2))}
        return grads
    grads |= {"blind1": g1.sum((0, 1, 2)), "card1": (sign * g1).sum((0, 1, 2)),
              "signal1": g1.sum((0, 2)), "card_signal1": (sign * g1).sum((0, 2))}
    if "shown1" in params:
        grads |= {"shown1": g1.sum((0, 1)), "card_shown1": (sign * g1).sum((0, 1))}
    return grads


def shown_input(s: Setting, rng: np.random.Generator, p0: np.ndarray, greedy0: np.ndarray,
                c0: int, a0: int) -> int:
    """What player 1 is shown beside the move (index into its policy's third axis)."""
    if s.shown == "greedy":
        return int(greedy0[c0])
    if s.shown == "belief":  # the plan's move for the other card decides whether a0 tells c0
        return c0 if rng.choice(3, p=p0[1 - c0]) != a0 else 2
    return int(greedy0[c0])  # nothing shown: player 1's policy is the same along that axis


def exact_return(table: np.ndarray, s: Setting, p0: np.ndarray, greedy0: np.ndarray, p1: np.ndarray) -> float:
    """Expected return of the joint policy over the four deals (and, for the belief, the plans)."""
    if s.shown != "belief":
        p1_seen = p1[:, :, greedy0, :].transpose(2, 0, 1, 3)  # (card0, card1, action, answer)
        return float((0.25 * p0[:, None, :, None] * p1_seen * table).sum())
    total = 0.0
    for c0, c1, a0, other in np.ndindex(2, 2, 3, 3):
        shown = c0 if other != a0 else 2
        total += 0.25 * p0[c0, a0] * p0[1 - c0, other] * (p1[c1, a0, shown] * table[c0, c1, a0]).sum()
    return float(total)


def train(table: np.ndarray, seed: int, s: Setting, groups: int = 8, group_size: int = 8,
          lr: float = 0.05) -> float:
    """Sampled GRPO + Adam from a card-blind start; returns the final policy's exact expected return."""
    rng = np.random.default_rng(seed)
    params, rates = init_params(rng, s)
    moments = {n: (np.zeros_like(v), np.zeros_like(v)) for n, v in params.items()}
    rows0 = groups * group_size
    rows1 = rows0 * s.partner_samples
    for t in range(1, s.steps + 1):
        coef = s.beta * max(0.0, 1.0 - (t - 1) / s.decay) if s.decay else s.beta
        p0, greedy0, p1 = joint_policy(params)
        g0, g1 = np.zeros((2, 3)), np.zeros((2, 3, 3, 3))  # gradients w.r.t. each information set's logits
        for _ in range(groups):
            c0, c1 = rng.integers(2), rng.integers(2)  # the group's deal
            a0 = np.array([rng.choice(3, p=p0[c0]) for _ in range(group_size)])
            shown = np.array([shown_input(s, rng, p0, greedy0, c0, a) for a in a0])
            a1 = np.array([[rng.choice(3, p=p1[c1, a, x]) for _ in range(s.partner_samples)]
                           for a, x in zip(a0, shown, strict=True)])  # (group, partner samples)
            returns = table[c0, c1, a0[:, None], a1]
            credit0 = returns.mean(1) + s.optimism * (returns.max(1) - returns.mean(1))
            adv0 = (credit0 - credit0.mean()) / (credit0.std() + 1e-6)
            adv1 = (returns - returns.mean()) / (returns.std() + 1e-6)
            for x0, x, a, row_adv1, answers in zip(a0, shown, adv0, adv1, a1, strict=True):
                g0[c0] += (a * (np.eye(3)[x0] - p0[c0]) + coef * entropy_grad(p0[c0])) / rows0
                q = p1[c1, x0, x]
                for x1, b in zip(answers, row_adv1, strict=True):
                    g1[c1, x0, x] += (b * (np.eye(3)[x1] - q) + coef * entropy_grad(q)) / rows1
        for name, grad in parameter_grads(g0, g1, params).items():  # Adam ascent
            m, v = moments[name]
            m[:] = 0.9 * m + 0.1 * grad
            v[:] = 0.999 * v + 0.001 * grad * grad
            params[name] += rates[name] * lr * (m / (1 - 0.9**t)) / (np.sqrt(v / (1 - 0.999**t)) + 1e-8)
    return exact_return(table, s, *joint_policy(params))


SETTINGS = [
    Setting("independent cards (k=1), no bonus, 120 steps", 1.0, 0.0, 0, 120),
    Setting("shared features (k=0.3), no bonus, 120 steps", 0.3, 0.0, 0, 120),
    Setting("k=0.3, bonus 1.0 decayed over 60 of 120 steps", 0.3, 1.0, 60, 120),
    Setting("k=0.3, bonus 1.0 decayed over 160 of 220 steps", 0.3, 1.0, 160, 220),
    Setting("k=0.1, bonus 1.0 decayed over 160 of 220 steps", 0.1, 1.0, 160, 220),
    Setting("k=0.3, bonus 1.0 decayed over 300 of 400 steps", 0.3, 1.0, 300, 400),
    Setting("k=0.1, bonus 1.0 decayed over 450 of 600 steps", 0.1, 1.0, 450, 600),
    # player 1's signals share features too: the LM's outcomes
    Setting("k=0.3, signal tie k_sig=1, bonus over 160 of 220", 0.3, 1.0, 160, 220, k_sig=1.0),
    Setting("k=0.3, signal tie k_sig=0.3, bonus over 160 of 220", 0.3, 1.0, 160, 220, k_sig=0.3),
    Setting("k=0.3, k_sig=0.3, bonus over 300 of 400", 0.3, 1.0, 300, 400, k_sig=0.3),
    Setting("k=0.3, k_sig=0.1, bonus over 160 of 220", 0.3, 1.0, 160, 220, k_sig=0.1),
    Setting("k=0.3, k_sig=0.3, SAD, bonus over 160 of 220", 0.3, 1.0, 160, 220, k_sig=0.3, shown="greedy"),
    Setting("k=0.6, k_sig=0.6, bonus over 160 of 220", 0.6, 1.0, 160, 220, k_sig=0.6),
    # what 10 needs of player 1: its answer to a signal is XOR(its card, the signal), an interaction
    Setting("k=0.3, k_sig=0.3, card x signal part at 0.3 (not 0.09), bonus over 160 of 220", 0.3, 1.0, 160,
            220, k_sig=0.3, k_inter=0.3),
    Setting("k=0.3, k_sig=0.3, card x signal part at 0.6, bonus over 160 of 220", 0.3, 1.0, 160, 220,
            k_sig=0.3, k_inter=0.6),
    # joint credit and public information: none of them leaves the LM's 9 convention
    Setting("k=0.3, k_sig=0.3, optimistic credit (max of 4 answers), bonus over 160 of 220", 0.3, 1.0, 160,
            220, k_sig=0.3, partner_samples=4, optimism=1.0),
    Setting("k=0.3, k_sig=0.3, half-optimistic credit (4 answers), bonus over 160 of 220", 0.3, 1.0, 160,
            220, k_sig=0.3, partner_samples=4, optimism=0.5),
    Setting("k=0.3, k_sig=0.3, public belief (BAD), bonus over 160 of 220", 0.3, 1.0, 160, 220,
            k_sig=0.3, shown="belief"),
    Setting("k=0.6, k_sig=0.6, public belief (BAD), bonus over 160 of 220", 0.6, 1.0, 160, 220,
            k_sig=0.6, shown="belief"),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=6)
    p.add_argument("--steps", type=int, default=None, help="override every setting's steps (smoke runs)")
    args = p.parse_args()
    table = payoff_table()
    print(f"tiny_hanabi, sampled GRPO + Adam, 64 episodes a step, {args.seeds} seeds")
    print("| setting | final returns (one decimal) | runs at 10 |")
    print("|---|---|---|")
    for s in SETTINGS:
        steps = args.steps or s.steps
        s = replace(s, decay=min(s.decay, steps), steps=steps)
        finals = [train(table, seed, s) for seed in range(args.seeds)]
        shown = ", ".join(f"{f:.1f}" for f in sorted(finals))
        print(f"| {s.name} | {shown} | {sum(f > 9.5 for f in finals)}/{args.seeds} |", flush=True)


if __name__ == "__main__":
    main()
