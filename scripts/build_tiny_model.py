"""Build roll_ma's built-in tiny model (``model.path=builtin:tiny``) from scratch on a CPU.

A 1.04M-parameter Qwen2 and its own byte-level BPE tokenizer, supervised on text rendered by
the real envs (math self-play in every role, tiny Hanabi turns), stopped as soon as the
solver's greedy accuracy on the held-out split reaches ``--threshold``: a base that can do
the tasks a little, with room for RL to show. About 5-7 minutes on 2 idle cores (the habits
base takes 1520 steps, ~15 minutes).

    python scripts/build_tiny_model.py                      # writes roll_ma/assets/tiny_model
    python scripts/build_tiny_model.py --hanabi-answers habits --out roll_ma/assets/tiny_habits_model
    python scripts/build_tiny_model.py --out /tmp/tiny --threshold 0.3

What the data teaches (findings of the research spike, see docs/tiny_model.md):
- solver: ``\\boxed{85}``; 45% a+b, 45% a-b (2-digit), 10% 1-digit a*b;
- critic: restate, compute, compare: ``37+48=85 Incorrect`` (judged answers half right, wrong
  ones mostly near misses). A verdict-only or ``\\boxed{}``-style critic stayed at chance;
- refiner: after ``Incorrect``, the right answer in ``\\boxed{}``;
- tiny Hanabi: a uniformly random legal action, well formed, so RL starts from legal play.
  `--hanabi-answers habits` draws the answers from fixed random habits instead, one preference
  per information set (`hanabi_habits`): a base whose card matters to it, on which tiny Hanabi
  self-play gets past 8 (see docs/tiny_model.md). Shipped as `builtin:tiny-habits`, the tiny
  Hanabi demo's base (bit-identical rebuild on 2 cores); not the math demo's, whose gain on it
  is 13-19 points across seeds (15 needed; +18.5 on `builtin:tiny` at the demo's seed).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from roll_ma.data import arithmetic_problem, is_heldout
from roll_ma.envs import make_env
from roll_ma.envs.math_selfplay import extract_boxed

OUT = Path(__file__).resolve().parents[1] / "roll_ma" / "assets" / "tiny_model"


def render(messages: list[dict]) -> str:
    """The chat template's text with the generation prompt (checked against the tokenizer below)."""
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + "<|im_start|>assistant\n"


def near_miss(rng: random.Random, ans: int) -> int:
    """A wrong answer like a weak solver's: mostly off by a little or a digit, sometimes random."""
    for _ in range(100):
        if rng.random() < 0.7:
            w = ans + rng.choice([-1, 1, -2, 2, -3, 3, -10, 10, -11, -9, 9, 11])
            if rng.random() < 0.2 and ans >= 10:
                w = int(str(ans)[::-1])
        else:
            w = rng.randint(0, 198)
        if w != ans and w >= 0:
            return w
    return ans + 1


def draw_problem(rng: random.Random) -> dict:
    while True:  # never a held-out problem: the runs evaluate on those
        level = 3 if rng.random() < 0.3 else 2  # level 3 adds 1-digit a*b for a third of its draws
        p = arithmetic_problem(rng, level)
        if not is_heldout(p["problem"]):
            return p


def info_set(turn) -> str:
    """The acting player's prompt text: what it sees, so one key per information set."""
    return turn.messages[-1]["content"]


def hanabi_habits(env, rng: random.Random) -> dict[str, list[float]]:
    """A fixed random preference over the legal actions at each information set of a game.

    Keyed by the acting player's prompt (its information set), drawn once per build in game-tree
    order: Dirichlet(1) weights, so some habits are strong and some nearly uniform. Like a
    pretrained model's priors they carry no knowledge of the payoffs; they make the model's
    answer depend on what it sees. Uniform answers do not: a LoRA step that raises an answer
    for one card raises it 0.98 as much for the other (0.28 on the seed-0 habits base;
    `docs/studies/tiny_hanabi/tiny_hanabi_card_tie.py`).
    """
    habits, frontier = {}, [env.game.new_initial_state()]
    while frontier:
        state = frontier.pop(0)
        if state.is_terminal():
            continue
        if not state.is_chance_node():
            key = info_set(env.turn_at(state))
            if key not in habits:  # why: several deals share one information set
                weights = [rng.expovariate(1.0) for _ in state.legal_actions()]
                habits[key] = [w / sum(weights) for w in weights]
        frontier.extend(state.child(a) for a in state.legal_actions())
    return habits


class Examples:
    """(prompt text, reply) pairs rendered by the real envs, so pre-training sees the run's prompts."""

    def __init__(self, seed: int, hanabi_answers: str = "uniform"):
        self.rng = random.Random(seed)
        self.math = make_env("math_selfplay")
        self.hanabi = make_env("tiny_hanabi")
        # why: a separate stream, so the habits do not shift the examples' draws
        self.habits = (
            hanabi_habits(self.hanabi, random.Random(seed + 1)) if hanabi_answers == "habits" else None
        )

    def solver(self, problem: dict) -> tuple[str, str]:
        turn = self.math.reset(0, problem=problem)
        return render(turn.messages), f"\\boxed{{{problem['answer']}}}"

    def critic(self, problem: dict) -> tuple[str, str]:
        ans = int(problem["answer"])
        shown = ans if self.rng.random() < 0.5 else near_miss(self.rng, ans)
        self.math.reset(0, problem=problem)
        turn = self.math.step(f"\\boxed{{{shown}}}").next_turn
        verdict = "Correct" if shown == ans else "Incorrect"
        return render(turn.messages), f"{problem['problem']}={ans} {verdict}"

    def refiner(self, problem: dict) -> tuple[str, str]:
        ans = int(problem["answer"])
        # the refiner runs after "Incorrect"; 30% of those verdicts were wrong (the solver was right)
        shown = ans if self.rng.random() < 0.3 else near_miss(self.rng, ans)
        critic_value = ans if (shown != ans and self.rng.random() < 0.5) else near_miss(self.rng, ans)
        self.math.reset(0, problem=problem)
        self.math.step(f"\\boxed{{{shown}}}")
        turn = self.math.step(f"{problem['problem']}={critic_value} Incorrect").next_turn
        return render(turn.messages), f"\\boxed{{{ans}}}"

    def hanabi_turn(self) -> tuple[str, str]:
        turn = self.hanabi.reset(self.rng.randrange(1 << 30))
        if self.rng.random() < 0.5:  # the second player's turn, after a random first move
            turn = self.hanabi.step(f"<answer>{self.rng.choice(turn.legal_actions)}</answer>").next_turn
        if self.habits is None:
            answer = self.rng.choice(turn.legal_actions)
        else:
            answer = self.rng.choices(turn.legal_actions, self.habits[info_set(turn)])[0]
        return render(turn.messages), f"<answer>{answer}</answer>"

    def sample(self, mix: dict[str, float]) -> tuple[str, str]:
        role = self.rng.choices(list(mix), weights=list(mix.values()))[0]
        if role == "hanabi":
            return self.hanabi_turn()
        return getattr(self, role)(draw_problem(self.rng))


def encode(
    tok, examples: list[tuple[str, str]], eos_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, T) ids, attention mask and labels: the loss is on the reply and its end token only."""
    prompts = tok([p for p, _ in examples], add_special_tokens=False)["input_ids"]
    replies = tok([r for _, r in examples], add_special_tokens=False)["input_ids"]
    seqs = [p + r + [eos_id] for p, r in zip(prompts, replies)]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tok.pad_token_id)
    labels = torch.full((len(seqs), width), -100)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (p, s) in enumerate(zip(prompts, seqs)):
        ids[i, : len(s)] = torch.tensor(s)
        labels[i, len(p) : len(s)] = torch.tensor(s[len(p) :])
        mask[i, : len(s)] = 1
    return ids, mask, labels


@torch.no_grad()
def solver_accuracy(model, tok, problems: list[dict], examples: Examples) -> float:
    model.eval()
    prompts = [examples.solver(p)[0] for p in problems]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    out = model.generate(
        **enc, max_new_tokens=8, do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id
    )
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    model.train()
    return sum(extract_boxed(t) == p["answer"] for t, p in zip(texts, problems)) / len(problems)


def check_reload(out: Path, tok, texts: list[str], messages: list[dict]) -> None:
    """The tokenizer as AutoTokenizer / vLLM load it must encode, decode and template exactly like ours."""
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(out)
    for t in texts + ["Ünïcödé 日本語 🙂 \t\n x^2 ∑ \\boxed{} 12345"]:
        a, b = tok(t, add_special_tokens=False)["input_ids"], loaded(t, add_special_tokens=False)["input_ids"]
        assert a == b and loaded.decode(b) == t, f"tokenizer changed on reload: {t!r}"
    assert loaded.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == render(
        messages
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--threshold", type=float, default=0.45, help="stop at this held-out solver accuracy")
    ap.add_argument("--max-steps", type=int, default=3000)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--hanabi-answers",
        choices=["uniform", "habits"],
        default="uniform",
        help="tiny Hanabi answers: uniformly random (the shipped base), or fixed random habits "
        "per information set (a base whose card matters to it; see docs/tiny_model.md)",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from roll_ma.models.tiny_tokenizer import build_tokenizer

    mix = {"solver": 0.4, "critic": 0.3, "refiner": 0.2, "hanabi": 0.1}
    examples = Examples(args.seed, args.hanabi_answers)
    heldout, rng = [], random.Random(12345)
    while len(heldout) < 200:  # the stopping eval: held-out 2-digit a+b / a-b
        p = arithmetic_problem(rng, 2)
        if is_heldout(p["problem"]) and p not in heldout:
            heldout.append(p)

    corpus = [p + r + "<|im_end|>" for p, r in (examples.sample(mix) for _ in range(3000))]
    tok = build_tokenizer(corpus, vocab_size=512, min_frequency=2)
    eos_id = tok.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=tok.pad_token_id,
    )
    model = Qwen2ForCausalLM(config)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / args.warmup))
    print(
        f"tokenizer {len(tok)} tokens, model {sum(p.numel() for p in model.parameters()):,} parameters",
        flush=True,
    )

    start, log, acc = time.time(), [], 0.0
    model.train()
    for step in range(1, args.max_steps + 1):
        ids, mask, labels = encode(tok, [examples.sample(mix) for _ in range(args.batch)], eos_id)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % args.eval_every == 0:
            acc = solver_accuracy(model, tok, heldout, examples)
            log.append(
                {
                    "step": step,
                    "seconds": round(time.time() - start, 1),
                    "loss": round(loss.item(), 4),
                    "solver_acc": acc,
                }
            )
            print(
                f"step {step}  {time.time() - start:.0f}s  loss {loss.item():.3f}  solver acc {acc:.3f}",
                flush=True,
            )
            if acc >= args.threshold:  # the jump is sudden: stop on accuracy, not on time
                break

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config.eos_token_id = eos_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    check_reload(out, tok, corpus[:300], [{"role": "user", "content": "Problem: 37+48"}])
    info = {
        "steps": step,
        "seconds": round(time.time() - start, 1),
        "solver_acc": acc,
        "threshold": args.threshold,
        "params": sum(p.numel() for p in model.parameters()),
        "vocab": len(tok),
        "mix": mix,
        "args": vars(args),
        "log": log,
        "built": time.strftime("%Y-%m-%d"),
    }
    (out / "build_info.json").write_text(json.dumps(info, indent=1))
    print(
        f"saved {out}: {step} steps, {info['seconds']:.0f}s, held-out solver accuracy {acc:.3f}", flush=True
    )


if __name__ == "__main__":
    main()
