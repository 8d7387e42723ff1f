"""How far a LoRA update for one card also moves the other card: the card tie of a base.

    python docs/studies/tiny_hanabi/tiny_hanabi_card_tie.py                      # the built-in tiny model
    python docs/studies/tiny_hanabi/tiny_hanabi_card_tie.py --model /tmp/my_base

For each tiny Hanabi information set and each answer, g(card) is the gradient, over a fresh
LoRA adapter's parameters, of that answer's logit (minus the mean of the three answers' logits)
at the token where the answers differ. The tie is <g(d0), g(d1)> / <g(d0), g(d0)>: how much a
small step that raises the answer for card d0 raises it for card d1, the other information set
that differs only in the acting seat's own card. 1.0 means the seat cannot tell its cards
apart by gradient steps; tiny Hanabi's best return (10) needs both seats to use their card,
while the best card-blind joint policy earns 8.

The signal tie is the same number for player 1's two signal answers: its information sets that
differ only in the partner's action, a0 vs a2. The best joint policy answers them in opposite
ways (a0 signals card d1, a2 card d0), so a tie near 1 there holds the seats at 9: player 1
answers a0 as it learned to answer a2, and player 0 keeps the safe a1 for card d1.
"""

from __future__ import annotations

import argparse

import torch
from tiny_hanabi_policy import info_set_prompts

from roll_ma.config.schema import ALL_LINEAR, ModelConfig
from roll_ma.envs.tiny_hanabi import TinyHanabiEnv
from roll_ma.models.adapters import AdapterSpec, inject_adapters, set_trainable
from roll_ma.models.loading import load_base_model, load_tokenizer


def answer_gradient(model, prompt: list[int], answers: list[list[int]], target: int) -> torch.Tensor:
    """Flat gradient of answer `target`'s centred logit at the first token where the answers differ."""
    first = 0
    while len({tuple(a[: first + 1]) for a in answers}) == 1:
        first += 1
    ids = torch.tensor([prompt + answers[target][:first]])
    logits = model(input_ids=ids).logits[0, -1]  # (V,) next-token logits
    choice = torch.stack([logits[a[first]] for a in answers])  # (A,)
    score = choice[target] - choice.mean()
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.cat([g.flatten() for g in torch.autograd.grad(score, params)])


def all_gradients(model, tokenizer, env: TinyHanabiEnv) -> dict[tuple, list[torch.Tensor]]:
    """Information set -> the gradient of each of the three answers there, each computed once."""
    prompts = info_set_prompts(env, tokenizer)
    answers = [tokenizer(env.parser.wrap(f"a{a}"), add_special_tokens=False)["input_ids"] for a in range(3)]
    return {key: [answer_gradient(model, prompt, answers, t) for t in range(3)]
            for key, prompt in prompts.items()}


def card_pairs(keys) -> list[tuple[tuple, tuple]]:
    """Sets that differ only in the acting seat's card; keys: (0, card) and (1, card, partner's action)."""
    return [(key, (key[0], 1, *key[2:])) for key in sorted(keys) if key[1] == 0]


# player 1's sets that differ only in the partner's signal, a0 vs a2
SIGNAL_PAIRS = [((1, card, 0), (1, card, 2)) for card in range(2)]


def ties(grads: dict[tuple, list[torch.Tensor]], pairs: list[tuple[tuple, tuple]]) -> list[tuple]:
    """(first set, answer, <g, g'> / <g, g>, cosine) for each pair of information sets and answer."""
    rows = []
    for key, other in pairs:
        for target, (g0, g1) in enumerate(zip(grads[key], grads[other], strict=True)):
            rows.append((key, target, float(g0 @ g1 / (g0 @ g0)),
                         float(torch.nn.functional.cosine_similarity(g0, g1, dim=0))))
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="builtin:tiny")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.manual_seed(args.seed)
    cfg = ModelConfig(path=args.model)
    tokenizer = load_tokenizer(cfg)
    spec = AdapterSpec(name="probe", rank=args.rank, alpha=2.0 * args.rank, dropout=0.0,
                       target_modules=tuple(ALL_LINEAR))
    model = inject_adapters(load_base_model(cfg), [spec], seed=args.seed)
    set_trainable(model, "probe")
    with torch.no_grad():
        # why: LoRA starts with B = 0, which leaves A without gradient; a small random B stands
        # for an adapter a few updates in, so both factors count
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.02)
    grads = all_gradients(model, tokenizer, TinyHanabiEnv())
    rows = ties(grads, card_pairs(grads))
    print("information set (card d0 vs d1), answer: tie  cosine")
    for key, target, tie, cos in rows:
        where = "seat 0" if key[0] == 0 else f"seat 1, partner a{key[2]}"
        print(f"  {where:20s} a{target}: {tie:6.3f}  {cos:6.3f}")
    print(f"mean tie {sum(r[2] for r in rows) / len(rows):.3f}")
    rows = ties(grads, SIGNAL_PAIRS)
    print("player 1's answer to partner a0 vs a2, same card: tie  cosine")
    for key, target, tie, cos in rows:
        print(f"  card d{key[1]}, answer a{target}: {tie:6.3f}  {cos:6.3f}")
    print(f"mean signal tie {sum(r[2] for r in rows) / len(rows):.3f}")


if __name__ == "__main__":
    main()
