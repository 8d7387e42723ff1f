"""Base model and tokenizer loading, tiny models, per-agent LoRA adapters."""
