"""verl's log-probs over packed rows: its unfused path against its fused one, as installed (issue 60).

verl's FSDP engine turns a packed micro-batch's hidden states (tokens, H) into log-probs either unfused (the
LM head's logits, then ``verl.utils.torch_functional.logprobs_from_logits``, which without flash-attn falls
back to ``logprobs_from_logits_v2``: on packed (tokens, vocab) logits its row loop runs once per token) or
fused (``use_fused_kernels``: ``FusedLinearForPPO``, the LM head and log-softmax in chunks; ``--paths``:
verl's torch backend, liger's). This times each on random hidden states and LM-head weights of the model's
shape (no model is built), over ``--tokens`` tokens: the forward alone (a scoring pass) and the forward +
backward into the hidden states (an update's). Run it in verl's environment (run_all's ``--sites``: verl's
staged site-packages first on PYTHONPATH); it prints numbers and never asserts. A path that fails (liger's
backend wants CUTLASS's Python DSL on an H200) gets its error in the table; the other paths still run.

    python benchmarks/peers/verl_logprobs.py                                 # CPU, small shapes
    python benchmarks/peers/verl_logprobs.py --device cuda --hidden 3584 --vocab 152064 --tokens 32768,8192
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: the shared helpers

from common import environment, int_list, log, report, str_list, warm_median_s  # noqa: E402

PATHS = ("unfused", "fused_torch", "fused_liger")


def parse_args(argv: list[str] | None = None):
    import argparse

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--hidden", type=int, default=64, help="the model's hidden size (Qwen2.5-7B: 3584)")
    p.add_argument("--vocab", type=int, default=1000, help="its vocabulary (Qwen2.5-7B: 152064)")
    p.add_argument("--tokens", type=int_list, default=[256], help="packed micro-batch lengths, in tokens")
    p.add_argument("--paths", type=str_list, default=list(PATHS[:2]), help=f"of {', '.join(PATHS)}")
    p.add_argument("--passes", type=str_list, default=["forward", "forward_backward"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="save the results as JSON here")
    args = p.parse_args(argv)
    unknown = [x for x in args.paths if x not in PATHS] + [
        x for x in args.passes if x not in ("forward", "forward_backward")
    ]
    if unknown:
        p.error(f"unknown --paths / --passes: {', '.join(unknown)}")
    return args


def log_probs_fn(path: str, weight):
    """(tokens, H) hidden states, (tokens,) labels -> (tokens,) log-probs, as verl's engine computes them."""
    import torch

    if path == "unfused":
        from verl.utils.torch_functional import logprobs_from_logits

        def unfused(hidden, labels):
            logits = hidden @ weight.T  # (tokens, vocab), the model's dtype, as the LM head returns them
            return logprobs_from_logits(logits, labels, inplace_backward=True)

        return unfused
    from verl.utils.experimental.torch_functional import FusedLinearForPPO

    fused = FusedLinearForPPO(impl_backend=path.removeprefix("fused_"))

    def fused_path(hidden, labels):
        return fused(hidden, weight, labels, 1.0)[0].to(torch.float32)

    return fused_path


def measure(path: str, tokens: int, args, weight) -> tuple[dict[str, Any], Any]:
    import torch

    gen = torch.Generator(args.device).manual_seed(tokens)
    hidden = torch.randn(tokens, args.hidden, device=args.device, generator=gen, dtype=weight.dtype)
    labels = torch.randint(0, args.vocab, (tokens,), device=args.device, generator=gen)
    fn = log_probs_fn(path, weight)

    def forward():
        with torch.no_grad():
            return fn(hidden, labels)

    def forward_backward():
        x = hidden.clone().requires_grad_()
        fn(x, labels).sum().backward()
        return x.grad

    if args.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    row: dict[str, Any] = {"path": path, "tokens": tokens}
    for name, pass_fn in (("forward", forward), ("forward_backward", forward_backward)):
        if name in args.passes:
            row[f"{name}_s"] = warm_median_s(pass_fn, args.repeats)
    if args.device == "cuda":
        row["peak_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)
    return row, forward()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    args = parse_args(argv)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    gen = torch.Generator(args.device).manual_seed(0)
    weight = torch.randn(args.vocab, args.hidden, device=args.device, dtype=dtype, generator=gen)
    weight = weight * args.hidden**-0.5  # (vocab, H) LM head, logits of a trained model's scale
    rows = []
    for tokens in args.tokens:
        first = None
        for path in args.paths:
            log(f"{path}, {tokens} tokens")
            try:
                row, out = measure(path, tokens, args, weight)
            except Exception as exc:  # one path's failure (a backend's missing dependency) ends only its row
                log(f"{path} failed: {type(exc).__name__}: {exc}")
                rows.append({"path": path, "tokens": tokens, "error": f"{type(exc).__name__}: {exc}"[:200]})
                continue
            first = out if first is None else first
            row["max_abs_diff"] = float((out.float() - first.float()).abs().max())  # against the first path
            rows.append(row)
    columns = ["path", "tokens", "forward_s", "forward_backward_s", "peak_gb", "max_abs_diff", "error"]
    notes = [
        f"hidden {args.hidden}, vocab {args.vocab}, {dtype}, median of {args.repeats}",
        "max_abs_diff: log-probs against the first measured path's on the same tokens",
    ]
    timers = ("forward_s", "forward_backward_s")
    summary = {f"{r['path']}_{k}_{r['tokens']}": r[k] for r in rows for k in timers if k in r}
    return report("verl_logprobs", args, environment(args.device), columns, rows, summary, notes)


if __name__ == "__main__":
    main(sys.argv[1:])
