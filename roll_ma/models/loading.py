"""Load the base model and tokenizer from a local path, a hub name, or the built-in tiny model."""

from __future__ import annotations

from pathlib import Path

from roll_ma.config.schema import ModelConfig
from roll_ma.models.builtin import ASSETS, BUILTIN_MODELS


def resolve_model_path(path: str) -> str:
    """'builtin:tiny' / 'builtin:tiny-habits' -> the shipped model directory; anything else as given."""
    if path in BUILTIN_MODELS:
        folder, build_args = BUILTIN_MODELS[path]
        if not (ASSETS / folder / "config.json").exists():
            raise FileNotFoundError(
                f"the built-in model {path} is missing at {ASSETS / folder}; rebuild it with "
                f"`python scripts/build_tiny_model.py{build_args}`"
            )
        return str(ASSETS / folder)
    return str(Path(path).expanduser()) if Path(path).expanduser().exists() else path


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def load_tokenizer(cfg: ModelConfig):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(
        resolve_model_path(cfg.tokenizer_path or cfg.path), trust_remote_code=cfg.trust_remote_code
    )
    if tok.pad_token_id is None:  # Qwen tokenizers have one; others often do not
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_base_model(cfg: ModelConfig, device: str = "cpu", packed_rows: bool = False):
    """The base causal LM in cfg.dtype on ``device``, in eval mode.

    ``packed_rows``: the model scores and trains rows packed without padding (train and reference
    workers): unless ``model.attn_implementation`` names one, attention is ``roll_ma_varlen``
    (variable-length flash attention for packed rows, sdpa for anything padded); ``model.liger_kernel``
    applies to these models only.
    """
    from transformers import AutoModelForCausalLM

    kwargs = {"dtype": torch_dtype(cfg.dtype), "trust_remote_code": cfg.trust_remote_code}
    if cfg.attn_implementation:
        kwargs["attn_implementation"] = cfg.attn_implementation
    elif packed_rows:
        from roll_ma.models.varlen_attention import register

        kwargs["attn_implementation"] = register()
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(cfg.path), **kwargs)
    if packed_rows:  # the train and reference models (before any adapter wraps them)
        from roll_ma.models.liger import apply_liger_kernels, liger_enabled

        if liger_enabled(cfg.liger_kernel, device, model):
            apply_liger_kernels(model)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    # transformers wraps .to with functools.wraps, whose type mypy does not bind to the instance
    return model.to(device).eval()  # type: ignore[arg-type]
