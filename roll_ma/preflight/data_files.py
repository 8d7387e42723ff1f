"""Every data file a config names, read and checked row by row before any actor starts.

- SFT and DPO files (``sft.path`` / ``dpo.path`` of each phase with ``source: file``): every row parsed
  as the phase will parse it (``data/chat_files.py``: the agent column names an agent, the prompt and
  every reply present and not empty after stripping), then tokenized with the run's tokenizer: a prompt
  and reply must fit the model's positions (``max_position_embeddings``; prompts are cut to
  ``model.max_prompt_tokens`` from the left, as the phase does).
- Problem files (``env.data.source`` / ``env.data.eval_source``) when the env or workflow reads
  problems: every row has a non-empty problem and answer (per ``env.data.preset`` / keys), or is an
  object (a workflow gets each record whole).

Bad rows are reported as ``file:line: field: what is wrong`` (lines counted from 1; parquet and json:
``file row N``), the first 20 of each file and then a count.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roll_ma.config.schema import RunConfig
from roll_ma.data.chat_files import Example, check_file, full_prompt_ids, reply_ids
from roll_ma.data.math_files import (
    RowProblem,
    in_file_order,
    listed,
    math_records,
    object_rows,
    read_located_rows,
)

LOCAL_ONLY = "roll_ma never downloads data; give a local path"


@dataclass
class ChatFile:
    """One SFT or DPO file of a phase, parsed."""

    key: str  # the config key naming it, e.g. sft.path or phases[2].dpo.path
    kind: str  # sft | dpo
    path: str
    phase: str
    trains: list[str]  # the agents the phase trains
    examples: list[Example] = field(default_factory=list)
    problems: list[RowProblem] = field(default_factory=list)
    unreadable: str | None = None  # the whole file could not be read (missing, not JSON, ...)

    @property
    def uses_messages(self) -> bool:
        return any(not isinstance(e.prompt, str) for e in self.examples)


def chat_files(cfg: RunConfig) -> list[ChatFile]:
    """The SFT / DPO files of ``cfg``'s phases, each read and parsed (no tokenizer needed yet)."""
    from roll_ma.config.phase_plan import plan_phases
    from roll_ma.config.run_plan import rl_loop

    if rl_loop(cfg):
        return []
    agents = [a.name for a in cfg.agents]
    files = []
    for phase in plan_phases(cfg):
        for kind in ("sft", "dpo"):
            settings = getattr(phase, kind)
            if phase.objective != kind or settings.source != "file":
                continue
            own = cfg.phases and "path" in getattr(cfg.phases[phase.index], kind)
            key = f"phases[{phase.index}].{kind}.path" if own else f"{kind}.path"
            chat = ChatFile(key, kind, str(settings.path or ""), phase.name, list(phase.agents))
            _read(chat, settings, agents)
            files.append(chat)
    return files


def _read(chat: ChatFile, settings: Any, agents: list[str]) -> None:
    """Parse ``chat``'s file (``settings``: the phase's sft or dpo block) into examples and problems."""
    key, kind = chat.key, chat.kind
    if not settings.path:
        chat.unreadable = f"{key}: {kind}.source=file needs {kind}.path (a .jsonl/.parquet/.json)"
        return
    path = Path(settings.path).expanduser()
    if not path.is_file():
        chat.unreadable = f"{key}: {settings.path} is not a file ({LOCAL_ONLY})"
        return
    try:
        chat.examples, chat.problems = check_file(
            kind, str(path), agents, settings.agent_key, getattr(settings, "messages_key", "messages"))
    except ValueError as err:  # not a data file at all (suffix, json layout)
        chat.unreadable = f"{key}: {err}"


def chat_file_problems(files: list[ChatFile], tokenizer: Any, max_prompt_tokens: int,
                       max_positions: int | None) -> list[str]:
    """Every problem of the parsed files, token lengths included when the tokenizer loaded."""
    out: list[str] = []
    for f in files:
        if f.unreadable:
            out.append(f.unreadable)
            continue
        problems = list(f.problems)
        if tokenizer is not None and max_positions:
            problems += _too_long(f.examples, tokenizer, max_prompt_tokens, max_positions)
        out.extend(listed(in_file_order(problems), f.path))
        if not f.problems and f.examples and not any(e.agent in f.trains for e in f.examples):
            out.append(f"{f.key}: none of the {len(f.examples)} rows of {f.path} names an agent that phase "
                       f"{f.phase!r} trains ({f.trains}); nothing would train")
    return out


def _too_long(examples: list[Example], tokenizer: Any, max_prompt_tokens: int, max_positions: int
              ) -> list[RowProblem]:
    """Rows whose (cut) prompt and reply together exceed the model's positions."""
    problems = []
    for e in examples:
        try:
            prompt = min(len(full_prompt_ids(tokenizer, e.prompt)), max_prompt_tokens)
        except Exception:  # noqa: BLE001 - a template that fails is reported with the tokenizer
            continue
        for name, text in zip(e.fields, e.replies, strict=True):
            n = len(reply_ids(tokenizer, text))
            if prompt + n > max_positions:
                problems.append(RowProblem(
                    e.where, name, f"{n} tokens, with the prompt's {prompt}, exceed the model's "
                                   f"{max_positions} positions (max_position_embeddings); shorten it",
                    e.number))
    return problems


def problem_file_problems(cfg: RunConfig) -> list[str]:
    """Every bad row of ``env.data.source`` / ``eval_source`` when the env or workflow reads problems."""
    from roll_ma.envs.env_registry import env_uses_problems

    data = cfg.env.data
    try:
        if not (cfg.env.workflow or env_uses_problems(cfg.env.name)):
            return []
    except (ValueError, ImportError):
        return []  # an env that does not load is reported by the config check
    plain_records = bool(cfg.env.workflow) and data.preset in ("auto", "custom") and not (
        data.problem_key or data.answer_key)
    preset = data.preset if data.preset not in ("auto", "custom") else None
    out: list[str] = []
    for key, source in (("env.data.source", data.source), ("env.data.eval_source", data.eval_source)):
        if not source or source == "synthetic" or source.startswith("builtin:"):
            continue
        path = str(Path(source).expanduser())
        if not Path(path).is_file():
            out.append(f"{key}: {source} is not a file; give a local .parquet/.jsonl/.json file, 'synthetic' "
                       "or (workflows) 'builtin:code_tasks'")
            continue
        try:
            rows, problems = read_located_rows(path)
            if plain_records:
                problems += object_rows(rows) if rows else [RowProblem(path, "", "the file holds no records")]
            else:
                problems += math_records(rows, path, preset, data.problem_key, data.answer_key)[1]
        except ValueError as err:
            out.append(f"{key}: {err}")
            continue
        out.extend(listed(in_file_order(problems), path))
    return out
