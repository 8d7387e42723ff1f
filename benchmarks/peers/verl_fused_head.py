"""verl's fused log-probs on a model with an untied LM head, for verl 0.9.1: imported in every verl process
(``VERL_USE_EXTERNAL_MODULES``, verl/__init__.py) of a row with ``actor_rollout_ref.model.use_fused_kernels``.

verl's fused path (``use_fused_kernels``, both backends, models/transformers/dense_common.py) reads
``self.lm_head.weight`` without calling the head. Since verl PR #5516 (2026-03), FSDP2 wraps an untied head
as a unit of its own (``_select_fsdp2_wrap_targets``), so that weight is still the sharded DTensor when the
fused path reads it: on the 7B (``tie_word_embeddings`` false) the torch backend fails at its first matmul
("aten.mm.default got mixed torch.Tensor and DTensor", H200, 2026-12-03), and the triton backend is handed
the DTensor (most likely the CUDA illegal access seen there that morning; not yet rerun). Tied models (the
3B and smaller) never wrap it. With this module the per-agent AT-GRPO row (torch backend) ran its seven steps
on the same H200 kind that evening.

This is the wrapping decision of verl PR #7427 (closed unmerged, 2026-08): the untied head stays in the root
FSDP2 unit, which gathers it before the model's forward; the embedding keeps its own unit. Nothing else of
verl changes. On one GPU the root unit gathers what the head's unit would: the same memory and no extra
traffic."""

import verl.utils.fsdp_utils as fsdp_utils

# verl's own selection (a second load of this module finds it behind the replacement, never wraps twice)
_installed = fsdp_utils._select_fsdp2_wrap_targets
verls_wrap_targets = getattr(_installed, "__wrapped__", _installed)


def wrap_targets_head_in_root(model, fsdp_transformer_layer_cls_to_wrap):
    """verl's FSDP2 wrap targets, less an untied LM head (it stays in the root unit)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    modules = verls_wrap_targets(model, fsdp_transformer_layer_cls_to_wrap)
    return [m for m in modules if m is not head]


wrap_targets_head_in_root.__wrapped__ = verls_wrap_targets  # type: ignore[attr-defined]

fsdp_utils._select_fsdp2_wrap_targets = wrap_targets_head_in_root
