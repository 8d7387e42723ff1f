"""LoRA branches computed in the base model's dtype (train.lora_compute_dtype=model).

PEFT keeps adapter weights in fp32 on a bf16 base and casts every LoRA input (tokens x features) to
fp32, then the branch's output back to bf16: two activation-sized casts per adapted layer and pass
(11% of the 7B update's kernel time in the 2026-11-26 profile, docs/benchmarks.md). Here the input
stays as it is and the small (rank x features) factors are cast instead. Autograd returns their
gradients in fp32, so the weights, their gradients and the optimizer stay fp32.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


class InputDtypeLinear(torch.nn.Linear):
    """A LoRA factor that computes in its input's dtype, its (fp32) weight cast per call."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight.to(x.dtype), bias)


def compute_lora_in_input_dtype(model: Any) -> int:
    """Switch every LoRA Linear of ``model`` (a PeftModel) to compute its branch in its input's dtype.

    Applies to the adapters injected so far (call it after the last one). Returns the number of LoRA
    layers changed. On an fp32 base nothing computes differently.
    """
    from peft.tuners.lora.layer import Linear as LoraLinear

    changed = 0
    for module in model.modules():
        if not isinstance(module, LoraLinear):
            continue
        module.cast_input_dtype_enabled = False  # PEFT's switch (peft.helpers.disable_input_dtype_casting)
        for factors in (module.lora_A, module.lora_B):
            for factor in factors.values():
                if type(factor) is torch.nn.Linear:  # a class swap: same parameters, same state dict
                    factor.__class__ = InputDtypeLinear
        changed += 1
    return changed
