"""Users' SFT and DPO files (jsonl, parquet, json) -> token rows of the agents they name.

SFT, one example per row (TRL's conversational formats): a ``messages`` list whose last message is
the assistant's reply (the loss is on that reply only; earlier messages are the prompt), or
``prompt`` (text or messages) + ``completion`` (text or one assistant message). DPO, one pair per
row (TRL's preference format): ``prompt`` (text or messages), ``chosen`` and ``rejected`` (text or
one assistant message each). Either kind has a column naming the agent the example trains
(``role`` by default: an agent name of the config).

Every row is checked the same way before the run starts (``roll_ma/preflight/data_files.py``) and when
the phase reads the file: the agent column names an agent of the run, the prompt and every reply are
present and not empty after stripping (a DPO pair never trains on an empty side), every message has a
role and text content. All bad rows are reported at once as ``file:line: field: what is wrong``.

Tokens: a prompt given as messages goes through the chat template with the generation prompt (what
the agent sees when it acts), a plain-text prompt is tokenized as it is (TRL's standard format); a
reply is its text's tokens followed by the end-of-turn token, as a model's own turn ends.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from roll_ma.config.typed import suggest
from roll_ma.data.math_files import Row, RowProblem, bad_rows_error, in_file_order, read_located_rows

MESSAGE_ROLES = ("system", "user", "assistant", "tool")  # what chat templates (Qwen, Llama, TRL data) render
ABSENT = object()  # a column or key the row does not have (an explicit null is reported as null, not missing)
NULL = "is null (no text)"


@dataclass(frozen=True)
class Example:
    """One row of a file: the agent, the prompt (text or messages) and one or two replies."""

    agent: str
    prompt: str | list[dict]
    replies: tuple[str, ...]  # SFT: (completion,); DPO: (chosen, rejected)
    where: str = ""  # file:line, for messages about this row
    fields: tuple[str, ...] = ()  # the replies' fields in the row (chosen, rejected, ...)
    number: int = 0  # the row's line (jsonl) or position, from 1


class _Row:
    """One row being parsed: its problems accumulate instead of stopping at the first."""

    def __init__(self, row: Row):
        self.where, self.value, self.number = row.where, row.value, row.number
        self.problems: list[RowProblem] = []

    def bad(self, field: str, message: str) -> None:
        self.problems.append(RowProblem(self.where, field, message, self.number))

    def text(self, value: Any, field: str) -> str | None:
        """A non-empty string, else a problem (None)."""
        if value is ABSENT:
            self.bad(field, "missing")
        elif value is None:
            self.bad(field, NULL)
        elif not isinstance(value, str):
            self.bad(field, f"must be text, got {type(value).__name__}")
        elif not value.strip():
            self.bad(field, "is empty")
        else:
            return value
        return None

    def messages(self, value: Any, field: str, expected: str = "a list of {role, content} messages"
                 ) -> list[dict] | None:
        """A list of {role, content} messages; content may be empty only in a system message."""
        if not isinstance(value, list):
            self.bad(field, f"must be {expected}, got {type(value).__name__}")
            return None
        if not value:
            self.bad(field, "is empty")
            return None
        out, ok = [], True
        for i, m in enumerate(value):
            if not isinstance(m, dict):
                self.bad(f"{field}[{i}]", f"must be a {{role, content}} message, got {type(m).__name__}")
                ok = False
                continue
            role = m.get("role", ABSENT)
            if role is None or role is ABSENT:
                self.text(role, f"{field}[{i}].role")  # missing, or null
                ok = False
            elif not isinstance(role, str) or not role.strip():
                self.bad(f"{field}[{i}].role", "must be a role name (text)")
                ok = False
            elif role not in MESSAGE_ROLES:  # chat templates render these; another role is a typo or lost
                self.bad(f"{field}[{i}].role", f"is {role!r}; a message's role is one of "
                                               f"{', '.join(MESSAGE_ROLES)}{suggest(role, MESSAGE_ROLES)}")
                ok = False
            content = m.get("content", ABSENT)
            if not isinstance(content, str):
                self.text(content, f"{field}[{i}].content")
                ok = False
            elif not content.strip() and role != "system":
                self.bad(f"{field}[{i}].content", "is empty")
                ok = False
            out.append({"role": str(role), "content": content})
        return out if ok else None

    def prompt(self, value: Any, field: str = "prompt") -> str | list[dict] | None:
        if value is None or value is ABSENT or isinstance(value, str):
            return self.text(value, field)
        return self.messages(value, field, "text or a list of {role, content} messages")

    def reply(self, value: Any, field: str) -> str | None:
        """Text, or one assistant message ({role, content} or a list of one)."""
        if isinstance(value, list) and len(value) == 1:
            value, field = value[0], f"{field}[0]"
        if isinstance(value, dict):
            role = value.get("role", "assistant")
            if role != "assistant":
                self.bad(f"{field}.role", f"is {role!r}; a reply is the assistant's message")
                return None
            return self.text(value.get("content", ABSENT), f"{field}.content")
        if isinstance(value, list):
            self.bad(field, f"must be text or one assistant message, got a list of {len(value)}")
            return None
        return self.text(value, field)

    def agent(self, agent_key: str, agents: list[str], setting: str) -> str | None:
        if agent_key not in self.value:
            self.bad(agent_key, f"missing: the column naming the agent this row trains ({setting}); the row "
                                f"has {sorted(self.value)}")
            return None
        name = self.text(self.value[agent_key], agent_key)
        if name is not None and name not in agents:
            from roll_ma.config.typed import suggest

            self.bad(agent_key, f"{name!r} is not an agent of this run{suggest(name, agents)}; "
                                f"agents: {agents}")
            return None
        return name


def _object(row: Row) -> _Row:
    parsed = _Row(row)
    if not isinstance(row.value, dict):
        parsed.bad("", f"is a {type(row.value).__name__}, not an object with columns")
    return parsed


def parse_sft_row(
    row: Row, agents: list[str], messages_key: str = "messages", agent_key: str = "role"
) -> tuple[Example | None, list[RowProblem]]:
    """The example of one SFT row, or None and every problem of the row."""
    r = _object(row)
    if r.problems:
        return None, r.problems
    agent = r.agent(agent_key, agents, "sft.agent_key")
    v = r.value
    if v.get(messages_key) is not None:
        messages = r.messages(v[messages_key], messages_key)
        if messages is not None:
            last = len(messages) - 1
            if messages[-1]["role"] != "assistant":
                r.bad(f"{messages_key}[{last}].role", f"is {messages[-1]['role']!r}; {messages_key!r} "
                      "must end with the assistant's reply (the loss is on it)")
            elif last == 0:
                r.bad(messages_key, "holds only the assistant's reply; the messages before it are the prompt")
        if r.problems:
            return None, r.problems
        assert agent is not None and messages is not None  # each None above recorded a problem
        field = f"{messages_key}[{last}].content"
        return Example(agent, messages[:-1], (messages[-1]["content"],), row.where, (field,), row.number), []
    if "prompt" in v or "completion" in v:
        prompt = r.prompt(v.get("prompt", ABSENT))
        reply = r.reply(v.get("completion", ABSENT), "completion")
        if r.problems:
            return None, r.problems
        assert agent is not None and prompt is not None and reply is not None  # else a problem was recorded
        return Example(agent, prompt, (reply,), row.where, ("completion",), row.number), []
    r.bad(messages_key, f"missing: an SFT row has a {messages_key!r} list (sft.messages_key) or prompt and "
                        f"completion columns; the row has {sorted(v)}")
    return None, r.problems


def parse_dpo_row(
    row: Row, agents: list[str], agent_key: str = "role"
) -> tuple[Example | None, list[RowProblem]]:
    """The pair of one DPO row (TRL's prompt / chosen / rejected), or None and every problem of the row."""
    r = _object(row)
    if r.problems:
        return None, r.problems
    agent = r.agent(agent_key, agents, "dpo.agent_key")
    prompt = r.prompt(r.value.get("prompt", ABSENT))
    chosen = r.reply(r.value.get("chosen", ABSENT), "chosen")
    rejected = r.reply(r.value.get("rejected", ABSENT), "rejected")
    if r.problems:
        return None, r.problems
    # each None above recorded a problem
    assert agent is not None and prompt is not None and chosen is not None and rejected is not None
    return Example(agent, prompt, (chosen, rejected), row.where, ("chosen", "rejected"), row.number), []


def check_file(kind: str, path: str, agents: list[str], agent_key: str = "role",
               messages_key: str = "messages") -> tuple[list[Example], list[RowProblem]]:
    """Every example of an SFT (``kind="sft"``) or DPO file and every problem of its rows (JSON included)."""
    rows, problems = read_located_rows(path)
    examples = []
    for row in rows:
        if kind == "sft":
            example, found = parse_sft_row(row, agents, messages_key, agent_key)
        else:
            example, found = parse_dpo_row(row, agents, agent_key)
        problems.extend(found)
        if example is not None:
            examples.append(example)
    if not rows and not problems:
        problems.append(RowProblem(path, "", "the file holds no rows"))
    return examples, in_file_order(problems)


def read_sft_file(
    path: str, agents: list[str], messages_key: str = "messages", agent_key: str = "role"
) -> list[Example]:
    """SFT examples of ``path`` (module docstring); PreflightError listing every bad row."""
    examples, problems = check_file("sft", path, agents, agent_key, messages_key)
    if problems:
        raise bad_rows_error(problems, path)
    return examples


def read_dpo_file(path: str, agents: list[str], agent_key: str = "role") -> list[Example]:
    """DPO pairs of ``path`` (TRL's prompt / chosen / rejected, plus the agent column); PreflightError
    listing every bad row."""
    examples, problems = check_file("dpo", path, agents, agent_key)
    if problems:
        raise bad_rows_error(problems, path)
    return examples


def prompt_ids(tokenizer: Any, prompt: str | list[dict], max_tokens: int) -> list[int]:
    """The prompt's tokens (chat template for messages), cut from the left to ``max_tokens``."""
    return full_prompt_ids(tokenizer, prompt)[-max_tokens:]


def full_prompt_ids(tokenizer: Any, prompt: str | list[dict]) -> list[int]:
    """The prompt's tokens before any cut (chat template for messages)."""
    if isinstance(prompt, str):
        return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    return list(
        tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=False)
    )


def reply_ids(tokenizer: Any, text: str) -> list[int]:
    """A reply's tokens and the end-of-turn token."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) + [tokenizer.eos_token_id]
