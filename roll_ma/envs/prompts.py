"""Chat prompts as token ids, cut to the model's prompt budget (shared by the env and workflow workers)."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import Any

# The cut search: it yields the messages whose prompt ids it needs next, is sent those ids, and returns
# (ids, cut). One search, written once, is driven one prompt at a time or many in lockstep.
CutSearch = Generator[list[dict], list[int], tuple[list[int], bool]]


def chat_prompt_ids(tokenizer: Any, messages: list[dict]) -> list[int]:
    """A turn's prompt ids: the chat template with the generation prompt (what every model turn sees)."""
    return list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    )


def chat_prompt_ids_batch(tokenizer: Any, conversations: list[list[dict]]) -> list[list[int]]:
    """``chat_prompt_ids`` of many conversations in one call: transformers renders each and hands the
    tokenizer the batch, the same ids per conversation as one call each."""
    if not conversations:
        return []
    ids = tokenizer.apply_chat_template(conversations, add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    return [list(row) for row in ids]


def _cut_search(messages: list[dict], max_prompt_tokens: int) -> CutSearch:
    """Chat-templated prompt ids and whether they were cut: an over-long history is cut from the left,
    the system message kept."""
    ids = yield messages
    if len(ids) <= max_prompt_tokens:
        return ids, False
    msgs = [dict(m) for m in messages]
    has_system = msgs[0]["role"] == "system"
    # 1) drop whole earlier messages, oldest first, keeping the system and the current message
    while len(msgs) > 1 + has_system and len(ids) > max_prompt_tokens:
        del msgs[int(has_system)]
        ids = yield msgs
    # 2) cut the current message's text from the left (its end holds the current observation)
    text = msgs[-1]["content"]
    lo, hi = 0, len(text)
    while lo < hi:  # smallest cut that fits
        mid = (lo + hi) // 2
        msgs[-1]["content"] = text[mid:]
        if len((yield msgs)) <= max_prompt_tokens:
            hi = mid
        else:
            lo = mid + 1
    msgs[-1]["content"] = text[lo:]
    ids = yield msgs
    if len(ids) > max_prompt_tokens:
        raise ValueError(
            f"the system prompt alone takes {len(ids)} tokens > model.max_prompt_tokens="
            f"{max_prompt_tokens}; raise model.max_prompt_tokens or shorten the prompt"
        )
    return ids, True


def encode_chat(tokenizer: Any, messages: list[dict], max_prompt_tokens: int) -> tuple[list[int], bool]:
    """Chat-templated prompt ids and whether they were cut: an over-long history is cut from the left,
    the system message kept."""
    search = _cut_search(messages, max_prompt_tokens)
    asked = next(search)
    while True:
        try:
            asked = search.send(chat_prompt_ids(tokenizer, asked))
        except StopIteration as done:
            return done.value


def encode_chats(tokenizer: Any, conversations: list[list[dict]], max_prompt_tokens: int,
                 threads: bool) -> list[tuple[list[int], bool]]:
    """``encode_chat`` of many conversations, their cut searches run in lockstep: each probe of every
    search is measured in one batched tokenizer call (the same ids and cuts as one at a time). ``threads``:
    that call runs on the tokenizer's thread pool (every core) even where TOKENIZERS_PARALLELISM is off."""
    searches = [_cut_search(messages, max_prompt_tokens) for messages in conversations]
    results: list[tuple[list[int], bool] | None] = [None] * len(searches)
    asked = {row: next(search) for row, search in enumerate(searches)}
    with _tokenizer_threads(threads):
        while asked:
            rows = list(asked)
            measured = chat_prompt_ids_batch(tokenizer, [asked[row] for row in rows])
            for row, ids in zip(rows, measured):
                try:
                    asked[row] = searches[row].send(ids)
                except StopIteration as done:
                    results[row] = done.value
                    del asked[row]
    assert all(result is not None for result in results)
    return results  # type: ignore[return-value]  # every search returned


@contextmanager
def _tokenizer_threads(on: bool) -> Iterator[None]:
    """The Rust tokenizer's batch calls on its thread pool for this block: it reads TOKENIZERS_PARALLELISM
    at every call. Ray's workers run with it off (a fork after the pool started could hang); the
    tokenizers binding turns it off in a forked child itself, so a fork after this block is safe."""
    if not on:
        yield
        return
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before
