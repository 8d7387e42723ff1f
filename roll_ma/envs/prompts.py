"""Chat prompts as token ids, cut to the model's prompt budget (shared by the env and workflow workers)."""

from __future__ import annotations

from typing import Any


def chat_prompt_ids(tokenizer: Any, messages: list[dict]) -> list[int]:
    """A turn's prompt ids: the chat template with the generation prompt (what every model turn sees)."""
    return list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    )


def encode_chat(tokenizer: Any, messages: list[dict], max_prompt_tokens: int) -> tuple[list[int], bool]:
    """Chat-templated prompt ids and whether they were cut: an over-long history is cut from the left,
    the system message kept."""
    ids = chat_prompt_ids(tokenizer, messages)
    if len(ids) <= max_prompt_tokens:
        return ids, False
    msgs = [dict(m) for m in messages]
    has_system = msgs[0]["role"] == "system"
    # 1) drop whole earlier messages, oldest first, keeping the system and the current message
    while len(msgs) > 1 + has_system and len(ids) > max_prompt_tokens:
        del msgs[int(has_system)]
        ids = chat_prompt_ids(tokenizer, msgs)
    # 2) cut the current message's text from the left (its end holds the current observation)
    text = msgs[-1]["content"]
    lo, hi = 0, len(text)
    while lo < hi:  # smallest cut that fits
        mid = (lo + hi) // 2
        msgs[-1]["content"] = text[mid:]
        if len(chat_prompt_ids(tokenizer, msgs)) <= max_prompt_tokens:
            hi = mid
        else:
            lo = mid + 1
    msgs[-1]["content"] = text[lo:]
    ids = chat_prompt_ids(tokenizer, msgs)
    if len(ids) > max_prompt_tokens:
        raise ValueError(
            f"the system prompt alone takes {len(ids)} tokens > model.max_prompt_tokens="
            f"{max_prompt_tokens}; raise model.max_prompt_tokens or shorten the prompt"
        )
    return ids, True
