"""Loading local math data sets (parquet, jsonl, json) as `{"problem", "answer"}` records.

Presets name the columns of common data sets (point them at your local copy):

| preset     | problem column | answer column | answer transform             |
|------------|----------------|---------------|------------------------------|
| deepscaler | problem        | answer        | -                            |
| gsm8k      | question       | answer        | text after the last `####`   |
| math500    | problem        | answer        | -                            |

`problem_key` / `answer_key` override a preset's columns or name them for any other file.
Nothing is downloaded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass


def gsm8k_final_answer(text: str) -> str:
    """The final answer of a GSM8K solution: the text after the last `####` (commas dropped from numbers)."""
    tail = text.rsplit("####", 1)[-1].strip()
    plain = tail.replace(",", "")
    return plain if plain.lstrip("-").replace(".", "", 1).isdigit() else tail


@dataclass(frozen=True)
class ColumnMap:
    """Which columns hold the problem and the answer, and how to clean the answer."""

    problem: str
    answer: str
    transform: Callable[[str], str] | None = None


PRESETS: dict[str, ColumnMap] = {
    "deepscaler": ColumnMap("problem", "answer"),
    "gsm8k": ColumnMap("question", "answer", gsm8k_final_answer),
    "math500": ColumnMap("problem", "answer"),
}


def _preset(name: str) -> ColumnMap:
    key = name.lower().replace("-", "").replace("_", "")
    if key not in PRESETS:
        raise ValueError(
            f"Unknown data preset {name!r}; choose one of {sorted(PRESETS)} or pass problem_key/answer_key"
        )
    return PRESETS[key]


def read_rows(path: str) -> list[dict]:
    """Rows of a .parquet, .jsonl or .json file as dicts."""
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"Data file not found: {path!r} (roll_ma never downloads data; give a local path)"
        )
    suffix = path.lower().rsplit(".", 1)[-1]
    if suffix == "parquet":
        import pyarrow.parquet as pq  # why: only parquet users pay the import

        return pq.read_table(path).to_pylist()
    if suffix == "jsonl":
        rows = []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from e
        return rows
    if suffix == "json":
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return _json_rows(data, path)
    raise ValueError(f"Unsupported data file {path!r}: use .parquet, .jsonl or .json")


def _json_rows(data: object, path: str) -> list[dict]:
    if isinstance(data, list):
        return data
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(data) == 1 and lists and all(isinstance(r, dict) for r in lists[0]):
            return lists[0]  # e.g. {"data": [{...}, ...]}
        if lists and len(lists) == len(data) and len({len(v) for v in lists}) == 1:
            keys = list(data)
            return [
                dict(zip(keys, values, strict=True)) for values in zip(*data.values(), strict=True)
            ]  # columnar
    raise ValueError(
        f"{path}: expected a list of records, {{'data': [records]}} or a dict of equal-length columns"
    )


def load_math_records(
    path: str,
    preset: str | None = None,
    problem_key: str | None = None,
    answer_key: str | None = None,
    limit: int | None = None,
) -> list[dict]:
    """Load `{"problem", "answer"}` records from a local file.

    Args:
        path: A .parquet, .jsonl or .json file.
        preset: "deepscaler", "gsm8k" or "math500" (see module docstring); None = plain columns.
        problem_key: Column of the problem (overrides the preset; default "problem").
        answer_key: Column of the answer (overrides the preset; default "answer").
        limit: Keep only the first `limit` records.

    Returns:
        A list of `{"problem": str, "answer": str}`.
    """
    columns = _preset(preset) if preset else ColumnMap("problem", "answer")
    problem_col = problem_key or columns.problem
    answer_col = answer_key or columns.answer
    rows = read_rows(path)
    if limit is not None:
        rows = rows[: int(limit)]
    if not rows:
        raise ValueError(f"{path}: the file holds no records")
    available = list(rows[0]) if isinstance(rows[0], dict) else []
    for role, col, flag in (("problem", problem_col, "problem_key"), ("answer", answer_col, "answer_key")):
        if col not in available:
            where = f"preset {preset!r} expects" if preset else "expected"
            raise ValueError(
                f"{path}: no column {col!r} for the {role} ({where} {problem_col!r}/{answer_col!r}). "
                f"Columns in the file: {', '.join(map(str, available)) or 'none'}. Pass {flag}=<column>."
            )
    records = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"{path}: record {i} is a {type(row).__name__}, not an object with columns")
        problem, answer = row.get(problem_col), row.get(answer_col)
        if problem is None or answer is None:
            raise ValueError(f"{path}: record {i} has no value for {problem_col!r} or {answer_col!r}")
        answer = str(answer)
        if columns.transform is not None and answer_key is None:
            answer = columns.transform(answer)
        records.append({"problem": str(problem), "answer": answer})
    return records
