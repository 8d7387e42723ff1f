"""Continue a tiny base with a listener prior for tiny Hanabi's player 1 (an experiment, not shipped).

    # ~6 min on 2 cores
    python docs/studies/tiny_hanabi/continue_listener_prior.py --out /tmp/bases/listener_p1 --perm-seed 1

Why: the step from 9 to 10 needs player 1 to answer the signal `a0` the opposite way from `a2`
(its card XOR the signal; docs/benchmarks.md). On `builtin:tiny-habits` RL ties the two answers
together instead. Here player 1's habits become, for each of its cards, a random permutation of
the answers over the partner's three actions (the permuted answer at ``--strength``, the other two
sharing the rest): a prior that a listener answers each signal differently, with no knowledge of
the payoffs. Player 0's habits and the math roles stay as they were: the training turns are the
build script's habit answers (cross-entropy), and the math replies are held to the starting base
by a KL over their tokens. The output is a base directory for ``model.path``.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "scripts"))
import build_tiny_model as build  # noqa: E402  (the script's examples, encoding and habits)

from roll_ma.models.loading import resolve_model_path  # noqa: E402

MATH_MIX = {"solver": 0.4, "critic": 0.3, "refiner": 0.2}


def listener_habits(habits: dict[str, list[float]], rng: random.Random, strength: float) -> dict:
    """Player 1's habits replaced by one random answer permutation per card; returns the permutations."""
    perms = {}
    for card in range(2):
        perms[card] = rng.sample(range(3), 3)
        for partner in range(3):
            # why: habits are keyed by the whole prompt; its first line is the env's observation
            seen = f"Player 1. Card d{card}. Partner chose a{partner}."
            keys = [key for key in habits if key.split("\n")[0] == seen]
            if len(keys) != 1:
                raise KeyError(f"{len(keys)} information sets start with {seen!r}: did the prompt change?")
            rest = (1 - strength) / 2
            habits[keys[0]] = [strength if a == perms[card][partner] else rest for a in range(3)]
    return perms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default="builtin:tiny-habits")
    p.add_argument("--out", required=True)
    p.add_argument("--perm-seed", type=int, default=1, help="draws player 1's answer permutations")
    p.add_argument("--strength", type=float, default=0.8, help="probability of the permuted answer")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch", type=int, default=64, help="tiny Hanabi turns and math replies a step, each")
    p.add_argument("--threads", type=int, default=2, help="torch threads (the bases in docs: 2)")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    src = resolve_model_path(args.base)
    tokenizer = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src)
    teacher = AutoModelForCausalLM.from_pretrained(src).eval()
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    examples = build.Examples(0, "habits")  # the habits the shipped habits base was built with
    perms = listener_habits(examples.habits, random.Random(args.perm_seed), args.strength)
    shown = "; ".join(f"card d{card}: {perm}" for card, perm in perms.items())
    print(f"player 1's answers to a0, a1, a2: {shown}", flush=True)

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    start = time.time()
    for step in range(1, args.steps + 1):
        hanabi = [examples.hanabi_turn() for _ in range(args.batch)]
        ids, mask, labels = build.encode(tokenizer, hanabi, eos_id)
        ce = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        math = [examples.sample(MATH_MIX) for _ in range(args.batch)]
        ids, mask, labels = build.encode(tokenizer, math, eos_id)
        reply = labels[:, 1:] != -100  # (B, T-1) positions that predict a reply token
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1][reply]
        with torch.no_grad():
            ref_logits = teacher(input_ids=ids, attention_mask=mask).logits[:, :-1][reply]
        kl = F.kl_div(logits.log_softmax(-1), ref_logits.log_softmax(-1), log_target=True,
                      reduction="batchmean")
        (ce + kl).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        if step % 25 == 0 or step == args.steps:
            print(f"step {step}: hanabi CE {ce.item():.3f}, math KL {kl.item():.4f}, "
                  f"{time.time() - start:.0f} s", flush=True)

    out = Path(args.out)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    for extra in Path(src).iterdir():  # chat template, generation config, build info
        if extra.is_file() and not (out / extra.name).exists():
            shutil.copy(extra, out / extra.name)
    print(f"saved {out}")


if __name__ == "__main__":
    main()
