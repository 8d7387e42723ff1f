"""model.liger_kernel: liger-kernel's fused RMSNorm, SwiGLU and rotary kernels in the train and reference
models.

The 7B update's profile (docs/benchmarks.md, 2026-11-26) spends ~35% of its kernel time in elementwise
kernels (RMSNorm, SwiGLU, rotary, casts); liger replaces the first three with fused Triton kernels.
Its LM-head kernels stay off: roll_ma computes log-probs chunk by chunk itself (models/logprobs.py).
Triton needs a CUDA GPU: ``true`` is refused on CPU runs; ``auto`` (the default) turns the kernels on
wherever they can run and falls back with one line that says why where they cannot.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
from typing import Any

INSTALL_HINT = "pip install 'roll_ma[liger]' (liger-kernel 0.8.5)"
# the kernels roll_ma asks for; liger's LM-head kernels stay off (roll_ma's chunked log-probs)
KERNELS = {"rope": True, "rms_norm": True, "swiglu": True, "cross_entropy": False,
           "fused_linear_cross_entropy": False}


def liger_problem(num_gpus: int, check_installed: bool = True) -> str | None:
    """Why model.liger_kernel cannot run (None: it can): no GPU, or liger-kernel not installed here
    (``check_installed=False``: a GPU config checked on another machine)."""
    if num_gpus == 0:
        return ("liger-kernel's Triton kernels need CUDA GPUs and this run has none (resources.num_gpus=0); "
                "turn model.liger_kernel off on CPU")
    if check_installed and importlib.util.find_spec("liger_kernel") is None:
        return f"liger-kernel is not installed: {INSTALL_HINT}"
    return None


_SAID: set[str] = set()  # the fallback lines this process has printed (one each, not one per model load)


def liger_enabled(setting: Any, device: Any, model: Any) -> bool:
    """Whether ``model`` (loaded on ``device``) gets liger's kernels under ``model.liger_kernel=setting``:
    true / false as given (true was checked where the run was configured); auto: on where a CUDA device,
    liger-kernel and kernels for the model's type are all there, else off with one printed line."""
    if setting != "auto":
        return bool(setting)
    reason = None
    if not str(device).startswith("cuda"):
        reason = "this process has no CUDA GPU (liger-kernel's Triton kernels need one)"
    elif "liger_kernel" not in sys.modules and importlib.util.find_spec("liger_kernel") is None:
        reason = f"liger-kernel is not installed ({INSTALL_HINT})"
    else:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

        model_type = getattr(model.config, "model_type", None)
        if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
            reason = f"liger-kernel has no kernels for model type {model_type!r}"
    if reason is None:
        return True
    if reason not in _SAID:
        _SAID.add(reason)
        print(f"[roll_ma] model.liger_kernel=auto: off, {reason}; the unfused path computes the same",
              flush=True)
    return False


def apply_liger_kernels(model: Any) -> None:
    """Patch ``model`` (a transformers causal LM, before adapters wrap it) with liger's fused kernels.
    Raises ImportError / ValueError naming what to do."""
    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN
    except ImportError as exc:
        raise ImportError(f"model.liger_kernel=true needs liger-kernel: {INSTALL_HINT} ({exc})") from exc
    model_type = getattr(model.config, "model_type", None)
    apply = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if apply is None:
        known = ", ".join(sorted(MODEL_TYPE_TO_APPLY_LIGER_FN))
        raise ValueError(f"model.liger_kernel: liger-kernel has no kernels for model type {model_type!r} "
                         f"(it patches: {known}); turn model.liger_kernel off for this model")
    params = inspect.signature(apply).parameters
    apply(model=model, **{k: v for k, v in KERNELS.items() if k in params})
