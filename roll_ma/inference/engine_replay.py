"""What roll_ma adds on top of the bare vLLM engine: record a step's generate calls, replay them bare.

A benchmark turns recording on for one step, then replays the same calls (same prompts, same
adapters, same number of tokens per row) straight on the engine with plain sampling settings (no
per-row seeds, no detokenizing, with and without log-probs). Comparing that rate with the
pipeline's rollout rate (``system/rollout_tokens_per_s``) shows the pipeline's own cost: env
stepping, tokenizing, Ray hops, packing, and the sampling options roll_ma asks for.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RecordedCall:
    prompts: list[list[int]]
    adapters: list[str | None]  # adapter name per row (None: the base model)
    temperature: float  # 0 = greedy
    top_p: float
    lengths: list[int]  # generated tokens per row
    seconds: float  # inside the strategy's generate() (engine + roll_ma's packing)


@dataclass
class GenerateRecorder:
    calls: list[RecordedCall] = field(default_factory=list)

    def add(self, call: RecordedCall) -> None:
        self.calls.append(call)

    def replay(self, llm: Any, lora_of: dict[str, Any], log_probs: bool) -> dict[str, float]:
        """Run every recorded call again on ``llm`` with exactly as many tokens per row; rates and times."""
        from vllm import SamplingParams

        tokens, seconds = 0, 0.0
        for call in self.calls:
            params = [
                SamplingParams(
                    n=1,
                    temperature=call.temperature,
                    top_p=call.top_p,
                    max_tokens=max(n, 1),
                    min_tokens=n,
                    ignore_eos=True,
                    logprobs=0 if log_probs else None,
                    detokenize=False,
                )
                for n in call.lengths
            ]
            start = time.perf_counter()
            outs = llm.generate(
                [{"prompt_token_ids": p} for p in call.prompts],
                params,
                lora_request=[lora_of[a] if a is not None else None for a in call.adapters],  # None: base
                use_tqdm=False,
            )
            seconds += time.perf_counter() - start
            tokens += sum(len(o.outputs[0].token_ids) for o in outs)
        return {"tokens": float(tokens), "seconds": seconds, "tok_s": tokens / max(seconds, 1e-9)}

    def summary(self) -> dict[str, float]:
        tokens = sum(sum(c.lengths) for c in self.calls)
        seconds = sum(c.seconds for c in self.calls)
        return {
            "calls": float(len(self.calls)),
            "rows": float(sum(len(c.prompts) for c in self.calls)),
            "tokens": float(tokens),
            "generate_seconds": seconds,
            "generate_tok_s": tokens / max(seconds, 1e-9),
        }
