"""A small tokenizer built on the spot with the `tokenizers` library (no downloads).

Byte-level BPE, so any text encodes (never an UNK); Qwen2's own normalizer (NFC) and
pre-tokenizer regex, which puts every digit in its own token (what lets a tiny model learn
arithmetic); ChatML markers as special tokens and Qwen's chat template, so prompts look the
same as with a real Qwen tokenizer.

Why Qwen2's exact regex: transformers 5 loads the tokenizer of any ``model_type: qwen2``
checkpoint as ``Qwen2Tokenizer``, which rebuilds the normalizer and pre-tokenizer from its own
constants and keeps only vocab and merges. A custom pre-tokenizer is silently replaced at load
time (AutoTokenizer, vLLM): a tiny model scored 43% with its in-memory tokenizer and 8% after
reloading it, with no warning.
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
# transformers' Qwen2Tokenizer.PRETOKENIZE_REGEX (kept here so a transformers upgrade cannot drift it)
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

DEFAULT_CORPUS = [
    "You are a helpful assistant. Answer with <answer>...</answer>.",
    "Problem: 37+48\nSolver: \\boxed{85}\nCritic: Correct Incorrect",
    "Legal actions: (Play 0), (Discard 1), (Reveal player +1 color R)",
    "The quick brown fox jumps over the lazy dog 0123456789 + - * / = ( ) { } [ ] < > .,;:!?",
]


def build_tokenizer(
    corpus: Iterable[str] | None = None, vocab_size: int = 512, pad_vocab_to: int | None = None,
    min_frequency: int = 0,
):
    """Train a byte-level BPE on ``corpus`` and wrap it as a ``PreTrainedTokenizerFast`` with a chat template.

    ``pad_vocab_to``: append filler tokens ``<|fill_{id}|>`` up to this many ids (see ``pad_vocab``).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=min_frequency,
        show_progress=False)
    tok.train_from_iterator(list(corpus or DEFAULT_CORPUS), trainer=trainer)
    if pad_vocab_to is not None:
        tok = pad_vocab(tok, pad_vocab_to)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        unk_token=None, additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = CHAT_TEMPLATE
    fast.padding_side = "left"
    return fast


def pad_vocab(tok, size: int):
    """The same BPE (merges, special-token ids) plus filler tokens ``<|fill_{id}|>`` up to ``size`` ids.

    A random-weight model of a real shape has a larger embedding (151936 ids for Qwen2.5) than
    this tokenizer, and samples any id: every id must decode, in HF and in vLLM's detokenizer.
    No merge produces a filler, so encoding never emits one; decoding one gives its literal text.
    """
    import json

    from tokenizers import Tokenizer

    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]  # the special tokens are in it too (ids 0..2)
    n = len(vocab)
    assert sorted(vocab.values()) == list(range(n)), "trained BPE ids are 0..n-1"
    if size < n:
        raise ValueError(f"pad_vocab_to={size} is smaller than the trained vocabulary ({n} tokens)")
    vocab.update({f"<|fill_{i}|>": i for i in range(n, size)})
    return Tokenizer.from_str(json.dumps(data))
