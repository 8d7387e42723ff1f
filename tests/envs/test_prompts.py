"""Chat prompts as ids: a round's prompts encoded together (env.batch_encode) give exactly the ids and cuts
of one prompt at a time, over-long histories and special-token text included."""

import os
import random

import pytest

from roll_ma.envs.prompts import encode_chat, encode_chats
from roll_ma.models.tiny_tokenizer import build_tokenizer

WORDS = ["Problem:", "37+48", "\\boxed{85}", "Correct", "Incorrect", "the", "quick", "fox", "=", "\n",
         "<|im_end|>", "<|im_start|>user", "é", "数学", "  ", "0123"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(pad_vocab_to=1024)


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _conversation(rng: random.Random) -> list[dict]:
    messages = [{"role": "system", "content": _text(rng, rng.randint(1, 8))}] if rng.random() < 0.7 else []
    for _ in range(rng.randint(0, 4)):
        messages.append({"role": "user", "content": _text(rng, rng.randint(1, 60))})
        messages.append({"role": "assistant", "content": _text(rng, rng.randint(1, 60))})
    messages.append({"role": "user", "content": _text(rng, rng.randint(1, 300))})
    return messages


class _CountingCalls:
    """The tokenizer's chat-template calls, counted, with TOKENIZERS_PARALLELISM as each one saw it."""

    def __init__(self, tokenizer, monkeypatch):
        self.calls: list[str | None] = []
        render = tokenizer.apply_chat_template

        def counted(*args, **kwargs):
            self.calls.append(os.environ.get("TOKENIZERS_PARALLELISM"))
            return render(*args, **kwargs)

        monkeypatch.setattr(tokenizer, "apply_chat_template", counted)


@pytest.mark.parametrize("threads", [False, True])
def test_encoded_together_equals_one_at_a_time(tokenizer, threads, monkeypatch):
    rng = random.Random(0)
    conversations = [_conversation(rng) for _ in range(60)]
    budget = 120
    counter = _CountingCalls(tokenizer, monkeypatch)
    one_by_one = []
    probes = []  # each conversation's tokenizations, one at a time
    for messages in conversations:
        before = len(counter.calls)
        one_by_one.append(encode_chat(tokenizer, messages, budget))
        probes.append(len(counter.calls) - before)
    counter.calls.clear()
    together = encode_chats(tokenizer, conversations, budget, threads=threads)
    assert together == one_by_one
    # in lockstep: one batched call per probe of the longest search, not one per prompt and probe
    assert len(counter.calls) == max(probes) < sum(probes)
    assert set(counter.calls) == {"true" if threads else os.environ.get("TOKENIZERS_PARALLELISM")}
    cut = sum(truncated for _, truncated in one_by_one)
    assert 10 < cut < 60  # the set holds prompts that fit and prompts cut (both paths of the search)
    assert all(len(ids) <= budget for ids, _ in together)


def test_the_caller_s_messages_are_left_as_they_were(tokenizer):
    rng = random.Random(1)
    conversations = [_conversation(rng) for _ in range(8)]
    kept = [[dict(m) for m in messages] for messages in conversations]
    encode_chats(tokenizer, conversations, 40, threads=False)
    assert conversations == kept


def test_a_system_prompt_over_the_budget_is_refused_in_both(tokenizer):
    messages = [{"role": "system", "content": "rules " * 200}, {"role": "user", "content": "go"}]
    with pytest.raises(ValueError, match="system prompt alone"):
        encode_chat(tokenizer, messages, 30)
    with pytest.raises(ValueError, match="system prompt alone"):
        encode_chats(tokenizer, [[{"role": "user", "content": "hi"}], messages], 30, threads=True)


def test_threads_leave_the_process_setting_as_it_was(tokenizer, monkeypatch):
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    encode_chats(tokenizer, [[{"role": "user", "content": "hi"}]], 30, threads=True)
    assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    monkeypatch.delenv("TOKENIZERS_PARALLELISM")
    encode_chats(tokenizer, [[{"role": "user", "content": "hi"}]], 30, threads=True)
    assert "TOKENIZERS_PARALLELISM" not in os.environ


def test_no_conversations_encode_to_nothing(tokenizer):
    assert encode_chats(tokenizer, [], 30, threads=True) == []
