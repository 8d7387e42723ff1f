"""Packed rows through PyTorch's variable-length flash kernel, for verl: imported in every verl process
(``VERL_USE_EXTERNAL_MODULES``, verl/__init__.py) of a row whose native
``+actor_rollout_ref.model.override_config.attn_implementation`` is ``roll_ma_varlen``.

verl packs a micro-batch's rows into one sequence (``use_remove_padding``) and runs them through
flash-attn's varlen kernel, the setting its performance page assumes. flash-attn has no wheel for the GPU's
torch 2.11 / CUDA 13, and through transformers' sdpa the packed rows need a block-diagonal mask over the
whole packed length: quadratic in it, off the flash kernels (the AT-GRPO port measured 20.6 s of reference
forward and 36.4 s of update a step that way, H200, 2026-12-03). Registering ``roll_ma_varlen`` gives
verl the FlashAttention-2 kernels inside PyTorch (``torch.nn.attention.varlen``), the rows' boundaries read
from the packed position ids verl passes: the kernel roll_ma's own packed rows run on, no more."""

from roll_ma.models.varlen_attention import register

NAME = register()
