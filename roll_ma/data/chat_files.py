"""Users' SFT and DPO files (jsonl, parquet, json) -> token rows of the agents they name.

SFT, one example per row (TRL's conversational formats): a ``messages`` list whose last message is
the assistant's reply (the loss is on that reply only; earlier messages are the prompt), or
``prompt`` (text or messages) + ``completion`` (text or one assistant message). DPO, one pair per
row (TRL's preference format): ``prompt`` (text or messages), ``chosen`` and ``rejected`` (text or
one assistant message each). Either kind has a column naming the agent the example trains
(``role`` by default: an agent name of the config).

Tokens: a prompt given as messages goes through the chat template with the generation prompt (what
the agent sees when it acts), a plain-text prompt is tokenized as it is (TRL's standard format); a
reply is its text's tokens followed by the end-of-turn token, as a model's own turn ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from roll_ma.data.loader import read_rows


@dataclass(frozen=True)
class Example:
    """One row of a file: the agent, the prompt (text or messages) and one or two replies."""

    agent: str
    prompt: str | list[dict]
    replies: tuple[str, ...]  # SFT: (completion,); DPO: (chosen, rejected)


def _reply_text(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict) and "content" in value[0]:
        return str(value[0]["content"])
    if isinstance(value, dict) and "content" in value:
        return str(value["content"])
    raise ValueError(f"{where}: a reply must be text or one assistant message, got {type(value).__name__}")


def _prompt(value: Any, where: str) -> str | list[dict]:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in value):
        return [{"role": str(m["role"]), "content": str(m["content"])} for m in value]
    raise ValueError(f"{where}: a prompt must be text or a list of {{role, content}} messages")


def _agent(row: dict, agent_key: str, agents: list[str], where: str) -> str:
    if agent_key not in row:
        raise ValueError(f"{where}: no column {agent_key!r} naming the agent; the row has {sorted(row)}")
    agent = str(row[agent_key])
    if agent not in agents:
        raise ValueError(f"{where}: {agent_key}={agent!r} is not an agent of this run ({agents})")
    return agent


def read_sft_file(
    path: str, agents: list[str], messages_key: str = "messages", agent_key: str = "role"
) -> list[Example]:
    """SFT examples of ``path`` (module docstring); every problem names the row and the fix."""
    out = []
    for i, row in enumerate(read_rows(path)):
        where = f"{path} row {i}"
        agent = _agent(row, agent_key, agents, where)
        if messages_key in row and row[messages_key] is not None:
            messages = _prompt(list(row[messages_key]), where)
            if isinstance(messages, str) or not messages or messages[-1]["role"] != "assistant":
                raise ValueError(f"{where}: {messages_key!r} must end with the assistant's reply")
            out.append(Example(agent, messages[:-1], (messages[-1]["content"],)))
        elif "prompt" in row and "completion" in row:
            out.append(
                Example(agent, _prompt(row["prompt"], where), (_reply_text(row["completion"], where),))
            )
        else:
            raise ValueError(f"{where}: needs a {messages_key!r} column or prompt and completion columns")
    return out


def read_dpo_file(path: str, agents: list[str], agent_key: str = "role") -> list[Example]:
    """DPO pairs of ``path`` (TRL's prompt / chosen / rejected, plus the agent column)."""
    out = []
    for i, row in enumerate(read_rows(path)):
        where = f"{path} row {i}"
        missing = [k for k in ("prompt", "chosen", "rejected") if k not in row]
        if missing:
            raise ValueError(
                f"{where}: lacks {missing}; DPO files have prompt, chosen and rejected columns "
                "(TRL's explicit-prompt format)"
            )
        replies = (_reply_text(row["chosen"], where), _reply_text(row["rejected"], where))
        out.append(Example(_agent(row, agent_key, agents, where), _prompt(row["prompt"], where), replies))
    return out


def prompt_ids(tokenizer: Any, prompt: str | list[dict], max_tokens: int) -> list[int]:
    """The prompt's tokens (chat template for messages), cut from the left to ``max_tokens``."""
    if isinstance(prompt, str):
        ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    else:
        ids = list(
            tokenizer.apply_chat_template(
                prompt, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
    return ids[-max_tokens:]


def reply_ids(tokenizer: Any, text: str) -> list[int]:
    """A reply's tokens and the end-of-turn token."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
