"""A small tokenizer built on the spot with the `tokenizers` library (no downloads).

Byte-level BPE, so any text encodes (never an UNK); digits are always single tokens, which
is what lets a tiny model learn arithmetic; Qwen-style chat markers are special tokens and
the chat template is the ChatML one that Qwen models use, so prompts look the same as with
a real Qwen tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

DEFAULT_CORPUS = [
    "You are a helpful assistant. Answer with <answer>...</answer>.",
    "Problem: 37+48\nSolver: \\boxed{85}\nCritic: Correct Incorrect",
    "Legal actions: (Play 0), (Discard 1), (Reveal player +1 color R)",
    "The quick brown fox jumps over the lazy dog 0123456789 + - * / = ( ) { } [ ] < > .,;:!?",
]


def build_tokenizer(corpus: Iterable[str] | None = None, vocab_size: int = 512):
    """Train a byte-level BPE on ``corpus`` and wrap it as a ``PreTrainedTokenizerFast`` with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False)
    tok.train_from_iterator(list(corpus or DEFAULT_CORPUS), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"])
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast
