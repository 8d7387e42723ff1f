"""Packed rows through transformers' sdpa against torch's varlen flash kernel (``roll_ma_varlen``).

A trainer that packs a micro-batch's rows into one sequence (roll_ma's ``train.remove_padding``, verl's
``use_remove_padding``) needs attention that keeps the rows apart. flash-attn's varlen kernel does it from
the rows' boundaries, but has no wheel for the GPU's torch 2.11 / CUDA 13; through transformers' ``sdpa``
the rows are kept apart by a block-diagonal mask over the whole packed length (transformers builds it from
the position ids), whose cost grows with the square of that length. This script times the decoder of a
random model (``--shape``) over one packed micro-batch of ``--tokens`` tokens made of rows of
``--row-len`` tokens, under each attention of ``--attention``: a forward without gradients (a scoring
pass) and a forward + backward into the activations (an update's, base weights frozen as under LoRA).
Built in memory on the device (no model files), the LM head left out: only the attention differs.

    python benchmarks/packed_attention.py                                  # CPU, tiny model
    # the relay job's shapes (docs/benchmarks.md, issue 60: 32,768-token scoring, 8,192-token update packs)
    python benchmarks/packed_attention.py --device cuda --shape qwen2.5-7b --tokens 32768,8192 --row-len 605
"""

from __future__ import annotations

import sys
from typing import Any

from common import base_parser, environment, int_list, log, report, setup_device, str_list, warm_median_s

ATTENTIONS = ("sdpa", "roll_ma_varlen")
PASSES = ("forward", "forward_backward")


def parse_args(argv: list[str] | None = None):
    p = base_parser(__doc__)
    p.add_argument("--tokens", type=int_list, default=[256], help="packed micro-batch lengths, in tokens")
    p.add_argument("--row-len", type=int, default=40, help="tokens a row (the last row takes the rest)")
    p.add_argument("--attention", type=str_list, default=list(ATTENTIONS), help=f"of {', '.join(ATTENTIONS)}")
    p.add_argument("--passes", type=str_list, default=list(PASSES), help=f"of {', '.join(PASSES)} (a 7B's "
                   "forward + backward over 32k tokens holds ~140 GB of activations: time its forward alone)")
    args = p.parse_args(argv)
    choices = [("--attention", args.attention, ATTENTIONS), ("--passes", args.passes, PASSES)]
    for flag, given, known in choices:
        unknown = [a for a in given if a not in known]
        if unknown:
            p.error(f"{flag}: {', '.join(unknown)} unknown; known: {', '.join(known)}")
    if args.row_len < 1 or any(t < 1 for t in args.tokens):
        p.error("--row-len and --tokens must be positive")
    return args


def packed_positions(tokens: int, row_len: int):
    """(1, tokens) position ids of rows of ``row_len`` tokens end to end, each restarting at 0."""
    import torch

    return (torch.arange(tokens) % row_len)[None]


def build_decoder(shape: str, vocab_size: int, dtype: str, device: str, seed: int):
    """A random model of ``shape``'s decoder (no LM head), its weights frozen."""
    import torch
    from transformers import AutoModelForCausalLM

    from roll_ma.models.tiny import make_config
    from roll_ma.models.varlen_attention import register

    register()
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(make_config(shape=shape, vocab_size=vocab_size),
                                                 dtype=getattr(torch, dtype))  # fmt: skip
    model.requires_grad_(False)
    return model.model.eval()


def measure(decoder, attention: str, tokens: int, row_len: int, repeats: int, device: str, passes: list[str]):
    """The row of timings, and the forward's (1, T, H) output (to compare the attentions' results)."""
    import torch

    decoder.config._attn_implementation = attention  # read at each forward: the mask and the kernel
    positions = packed_positions(tokens, row_len).to(device)
    ids = torch.randint(3, decoder.config.vocab_size, (1, tokens), device=device,
                        generator=torch.Generator(device).manual_seed(tokens))  # fmt: skip
    embeds = decoder.embed_tokens(ids).detach()  # (1, T, H)

    # no cache, as a trainer's forward: with one, transformers does not read packed rows from the positions
    def forward():
        with torch.no_grad():
            return decoder(inputs_embeds=embeds, position_ids=positions, use_cache=False).last_hidden_state

    def forward_backward():
        x = embeds.clone().requires_grad_()
        out = decoder(inputs_embeds=x, position_ids=positions, use_cache=False).last_hidden_state
        out.float().square().mean().backward()
        return x.grad

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    row: dict[str, Any] = {"attention": attention, "tokens": tokens, "rows": -(-tokens // row_len)}
    for name, fn in (("forward", forward), ("forward_backward", forward_backward)):
        if name in passes:
            row[f"{name}_s"] = warm_median_s(fn, repeats)
    if device == "cuda":
        row["peak_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)
    return row, forward()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    setup_device(args)
    decoder = build_decoder(args.shape, args.vocab_size, args.dtype, args.device, args.seed)
    rows = []
    for tokens in args.tokens:
        first = None  # the first attention's output: every other one must agree (rows kept apart alike)
        for attention in args.attention:
            log(f"{attention}, {tokens} tokens")
            row, out = measure(decoder, attention, tokens, args.row_len, args.repeats, args.device,
                               args.passes)  # fmt: skip
            first = out if first is None else first
            row["max_abs_diff"] = float((out.float() - first.float()).abs().max())
            row["out_max_abs"] = float(out.float().abs().max())  # the scale the difference is on
            rows.append(row)
    summary = {}
    for tokens in args.tokens:
        by = {r["attention"]: r for r in rows if r["tokens"] == tokens}
        if len(by) == 2:
            for name in args.passes:
                summary[f"sdpa_over_varlen_{name}_{tokens}"] = by["sdpa"][f"{name}_s"] / by["roll_ma_varlen"][
                    f"{name}_s"]  # fmt: skip
    columns = ["attention", "tokens", "rows", "forward_s", "forward_backward_s", "peak_gb", "max_abs_diff",
               "out_max_abs"]  # fmt: skip
    notes = [
        f"{args.shape} decoder, {args.dtype}, rows of {args.row_len} tokens, median of {args.repeats}",
        "max_abs_diff: the forward's output against the first attention's on the same tokens",
    ]
    return report("packed_attention", args, environment(args.device), columns, rows, summary, notes)


if __name__ == "__main__":
    main(sys.argv[1:])
