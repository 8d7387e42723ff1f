"""Model FLOPs of the train worker's passes, and the GPU's peak: what model FLOPs utilisation (MFU) needs.

The formula (written out in docs/benchmarks.md, "Model FLOPs utilisation"):

- a forward over a row of L real tokens, R of them response tokens, costs
  ``2 * P * L`` (every linear layer of the decoder: P = its weights, embeddings excluded)
  ``+ 2 * layers * (heads * head_dim) * L * (L + 1)`` (causal attention: QK^T and AV over the
  L(L+1)/2 query-key pairs) ``+ 2 * hidden * vocab * R`` (the LM head, on the response tokens only:
  no other logit is needed);
- a scoring pass (reference or old log-probs) is one forward;
- a LoRA update is two: the forward and the backward to the activations (the frozen base weights
  get no gradient; LoRA's own FLOPs are < 1% at rank 16). Recomputation by activation checkpointing
  is not counted: it is work the hardware does, not work the model needs (MFU, not HFU).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

# dense bf16 tensor-core peak per GPU, FLOP/s (vendor datasheets, no sparsity); matched on the device name
PEAK_BF16_FLOPS = (
    ("H200", 989.4e12),
    ("H100 PCIe", 756.0e12),
    ("H100", 989.4e12),  # SXM / HBM3
    ("H800", 989.4e12),
    ("A100", 312.0e12),
    ("A800", 312.0e12),
    ("L40S", 362.1e12),
    ("A10G", 70.0e12),
    ("B200", 2250.0e12),
)


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that its FLOPs depend on."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def of(cls, config: Any) -> ModelShape:
        """From a transformers config (Qwen2/3, Llama, Mistral and alike)."""
        heads = int(config.num_attention_heads)
        head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
        return cls(layers=int(config.num_hidden_layers), hidden=int(config.hidden_size), heads=heads,
                   kv_heads=int(getattr(config, "num_key_value_heads", None) or heads), head_dim=head_dim,
                   intermediate=int(config.intermediate_size), vocab=int(config.vocab_size))

    @property
    def linear_params(self) -> int:
        """Weights of the decoder's linear layers (q, k, v, o and the gated MLP), all layers."""
        q_o = 2 * self.hidden * self.heads * self.head_dim
        k_v = 2 * self.hidden * self.kv_heads * self.head_dim
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (q_o + k_v + mlp)


def forward_flops(shape: ModelShape, row_tokens: np.ndarray, response_tokens: np.ndarray) -> float:
    """FLOPs of one forward over rows of (N,) real tokens, (N,) of them response tokens."""
    lengths = np.asarray(row_tokens, dtype=np.float64)
    linear = 2.0 * shape.linear_params * lengths.sum()
    attention = 2.0 * shape.layers * shape.heads * shape.head_dim * float((lengths * (lengths + 1)).sum())
    head = 2.0 * shape.hidden * shape.vocab * float(np.sum(response_tokens))
    return linear + attention + head


def peak_flops(device_name: str) -> float | None:
    """Dense bf16 peak of a GPU by its name (``torch.cuda.get_device_name``); None if unknown.
    ``ROLL_MA_PEAK_TFLOPS`` overrides it (another GPU, or another precision)."""
    override = os.environ.get("ROLL_MA_PEAK_TFLOPS")
    if override:
        return float(override) * 1e12
    for key, flops in PEAK_BF16_FLOPS:
        if key.lower() in device_name.lower():
            return flops
    return None
