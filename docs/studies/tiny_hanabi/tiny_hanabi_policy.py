"""What the two seats of a tiny_hanabi_selfplay checkpoint learned: their exact policy tables.

    python docs/studies/tiny_hanabi/tiny_hanabi_policy.py outputs/tiny_hanabi_selfplay/checkpoints/step_000260

For every information set (player 0: its card; player 1: its card and player 0's action) the
prompt the env would show is scored against the three answers `<answer>a0</answer>` ..
`<answer>a2</answer>` under that seat's adapter, renormalised over the three (the same numbers
the action entropy bonus uses). Printed: both tables, the probability that an answer is
well-formed at all, and the exact expected return of the joint policy over the four deals, next
to the best achievable one. Sampling noise plays no part: this is the policy itself, not a
rollout of it. Without a checkpoint it prints the base model's tables.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import torch

from roll_ma.config.schema import ModelConfig
from roll_ma.envs.tiny_hanabi import TinyHanabiEnv
from roll_ma.models.loading import load_base_model, load_tokenizer
from roll_ma.models.logprobs import choice_log_probs


def info_set_prompts(env: TinyHanabiEnv, tokenizer) -> dict[tuple, list[int]]:
    """Prompt ids of every information set: (0, card) and (1, card, partner's action)."""
    prompts = {}
    states = {}
    for c0, c1 in itertools.product(range(2), range(2)):
        dealt = env.game.new_initial_state().child(c0).child(c1)
        states[(0, c0)] = dealt  # player 0 sees only its own card
        for a0 in range(3):
            states[(1, c1, a0)] = dealt.child(a0)  # player 1: its card and player 0's action
    for key, state in states.items():
        messages = env.turn_at(state).messages
        prompts[key] = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                          return_dict=False))
    return prompts


def policy_table(model, tokenizer, prompts: dict[tuple, list[int]],
                 answers: list[str]) -> dict[tuple, tuple[torch.Tensor, float]]:
    """Information set -> (probabilities over the answers renormalised, total probability of them)."""
    keys = sorted(prompts)
    width = max(len(prompts[k]) for k in keys)
    ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(prompts[k])) + prompts[k] for k in keys])
    mask = torch.tensor([[0] * (width - len(prompts[k])) + [1] * len(prompts[k]) for k in keys])
    choices = [[tokenizer(a, add_special_tokens=False)["input_ids"] for a in answers]] * len(keys)
    with torch.no_grad():
        lp, _ = choice_log_probs(model, ids, mask, choices)  # (S, 3)
    return {k: (torch.softmax(lp[i], -1), float(lp[i].exp().sum())) for i, k in enumerate(keys)}


def expected_return(env: TinyHanabiEnv, p0: dict, p1: dict) -> float:
    """Exact expected shared return of the joint policy over the four equally likely deals."""
    root = env.game.new_initial_state()
    total = 0.0
    for c0, c1 in itertools.product(range(2), range(2)):
        for a0, a1 in itertools.product(range(3), range(3)):
            prob = 0.25 * float(p0[(0, c0)][a0]) * float(p1[(1, c1, a0)][a1])
            total += prob * root.child(c0).child(c1).child(a0).child(a1).returns()[0]
    return total


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", nargs="?", help="a checkpoint dir (holding trainer/adapters/<agent>)")
    p.add_argument("--model", default="builtin:tiny-habits", help="the base the run trained on")
    p.add_argument("--agents", default="player_0,player_1", help="the adapter of seat 0 and of seat 1")
    args = p.parse_args()
    cfg = ModelConfig(path=args.model)
    tokenizer = load_tokenizer(cfg)
    env = TinyHanabiEnv()
    prompts = info_set_prompts(env, tokenizer)
    answers = [env.parser.wrap(f"a{a}") for a in range(3)]
    tables = {}
    for seat, agent in enumerate(args.agents.split(",")):
        model = load_base_model(cfg)
        if args.checkpoint:
            from peft import PeftModel

            adapter_dir = Path(args.checkpoint) / "trainer" / "adapters" / agent
            model = PeftModel.from_pretrained(model, str(adapter_dir))
        mine = {k: v for k, v in prompts.items() if k[0] == seat}
        tables[seat] = policy_table(model.eval(), tokenizer, mine, answers)
    print("seat 0: card -> P(a0, a1, a2)  [P(well-formed)]")
    for (_, c0), (probs, mass) in sorted(tables[0].items()):
        print(f"  d{c0}: {', '.join(f'{x:.2f}' for x in probs.tolist())}  [{mass:.2f}]")
    print("seat 1: card, partner's action -> P(a0, a1, a2)  [P(well-formed)]")
    for (_, c1, a0), (probs, mass) in sorted(tables[1].items()):
        print(f"  d{c1}, a{a0}: {', '.join(f'{x:.2f}' for x in probs.tolist())}  [{mass:.2f}]")
    policy0 = {k: probs for k, (probs, _) in tables[0].items()}
    policy1 = {k: probs for k, (probs, _) in tables[1].items()}
    value = expected_return(env, policy0, policy1)
    best = env.optimal_policy()[0]
    print(f"exact expected return of this joint policy: {value:.2f} (best achievable {best:.2f})")


if __name__ == "__main__":
    main()
