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
from typing import Any

from roll_ma.errors import PreflightError


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
            f"Unknown data preset {name!r}; choose one of {sorted(PRESETS)} or set env.data.problem_key and "
            "env.data.answer_key"
        )
    return PRESETS[key]


@dataclass(frozen=True)
class Row:
    """One record of a data file and where it is: ``file.jsonl:7`` (a jsonl's line) or ``file.parquet row 7``
    (other formats: the record's position), both counted from 1."""

    where: str
    value: Any
    number: int = 0  # the line (jsonl) or position, from 1: problems are listed in this order


@dataclass(frozen=True)
class RowProblem:
    """What is wrong with one row: ``file.jsonl:7: chosen: is empty``."""

    where: str
    field: str
    message: str
    number: int = 0  # the row's line or position (Row.number)

    def __str__(self) -> str:
        field = f"{self.field}: " if self.field else ""
        return f"{self.where}: {field}{self.message}"


MAX_LISTED = 20  # bad rows shown per file; the rest are counted


def listed(problems: list, path: str, limit: int = MAX_LISTED) -> list[str]:
    """The first ``limit`` problems of ``path`` as lines, then one line counting the rest."""
    lines = [str(p) for p in problems[:limit]]
    if len(problems) > limit:
        lines.append(f"... and {len(problems) - limit} more problems in {path} ({len(problems)} in all)")
    return lines


def in_file_order(problems: list[RowProblem]) -> list[RowProblem]:
    return sorted(problems, key=lambda p: p.number)


def bad_rows_error(problems: list, path: str) -> PreflightError:
    """The error for a file whose rows failed their checks: every problem (the first 20, then a count)."""
    return PreflightError(listed(problems, path), title=f"{path} has rows roll_ma cannot use")


def read_located_rows(path: str) -> tuple[list[Row], list[RowProblem]]:
    """Every row of a .parquet, .jsonl or .json file with where it is, and every jsonl line that is not
    valid JSON (all of them, not only the first)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"Data file not found: {path!r} (roll_ma never downloads data; give a local path)"
        )
    suffix = path.lower().rsplit(".", 1)[-1]
    if suffix == "parquet":
        import pyarrow.parquet as pq  # why: only parquet users pay the import

        return [Row(f"{path} row {i}", r, i) for i, r in enumerate(pq.read_table(path).to_pylist(), 1)], []
    if suffix == "jsonl":
        rows, bad = [], []
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(Row(f"{path}:{lineno}", json.loads(line), lineno))
                    except json.JSONDecodeError as e:
                        bad.append(RowProblem(f"{path}:{lineno}", "", f"not valid JSON ({e.msg})", lineno))
        return rows, bad
    if suffix == "json":
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return [Row(f"{path} row {i}", r, i) for i, r in enumerate(_json_rows(data, path), 1)], []
    raise ValueError(f"Unsupported data file {path!r}: use .parquet, .jsonl or .json")


def read_rows(path: str) -> list[dict]:
    """Rows of a .parquet, .jsonl or .json file as dicts (a jsonl line that is not JSON: an error listing
    every such line)."""
    rows, bad = read_located_rows(path)
    if bad:
        raise bad_rows_error(bad, path)
    return [r.value for r in rows]


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

    Raises:
        PreflightError listing every bad row (``file:line: column: what is wrong``, the first 20 then a
        count), ValueError for a column the file lacks altogether.
    """
    rows, bad = read_located_rows(path)
    if limit is not None:
        rows = rows[: int(limit)]
    records, problems = math_records(rows, path, preset, problem_key, answer_key)
    if bad or problems:
        raise bad_rows_error(in_file_order(bad + problems), path)
    return records


def math_records(
    rows: list[Row],
    path: str,
    preset: str | None = None,
    problem_key: str | None = None,
    answer_key: str | None = None,
) -> tuple[list[dict], list[RowProblem]]:
    """``{"problem", "answer"}`` of every good row, and what is wrong with every other one (a value that is
    missing or empty after stripping). ValueError when the file holds no rows or its first row lacks a
    column altogether (the preset or keys name the wrong columns: one message, not one per row)."""
    columns = _preset(preset) if preset else ColumnMap("problem", "answer")
    problem_col = problem_key or columns.problem
    answer_col = answer_key or columns.answer
    if not rows:
        raise ValueError(f"{path}: the file holds no records")
    first = rows[0].value
    available = list(first) if isinstance(first, dict) else []
    for role, col, flag in (("problem", problem_col, "env.data.problem_key"),
                            ("answer", answer_col, "env.data.answer_key")):
        if col not in available:
            where = f"preset {preset!r} expects" if preset else "expected"
            raise ValueError(
                f"{path}: no column {col!r} for the {role} ({where} {problem_col!r}/{answer_col!r}). "
                f"Columns in the file: {', '.join(map(str, available)) or 'none'}. Set {flag}=<column>."
            )
    records, problems = [], []
    for row in rows:
        if not isinstance(row.value, dict):
            problems.append(RowProblem(row.where, "", f"is a {type(row.value).__name__}, not an object "
                                                      "with columns", row.number))
            continue
        values = {}
        for col in (problem_col, answer_col):
            value = row.value.get(col)
            if value is None:  # an explicit null is said as such: the column is there
                said = "is null (no text)" if col in row.value else "missing"
                problems.append(RowProblem(row.where, col, said, row.number))
            elif not str(value).strip():
                problems.append(RowProblem(row.where, col, "is empty", row.number))
            values[col] = value
        if len(values) == 2 and all(v is not None and str(v).strip() for v in values.values()):
            answer = str(values[answer_col])
            if columns.transform is not None and answer_key is None:
                answer = columns.transform(answer)
            records.append({"problem": str(values[problem_col]), "answer": answer})
    return records, problems


def object_rows(rows: list[Row]) -> list[RowProblem]:
    """Rows that are not objects (a workflow gets each record whole, as a dict)."""
    return [RowProblem(r.where, "", f"is a {type(r.value).__name__}, not an object with columns", r.number)
            for r in rows if not isinstance(r.value, dict)]
