"""No function in roll_ma is longer than 80 lines: a longer one is split into named steps with one job each.

A function's length is its ``def`` line to its last line (decorators not counted; its docstring and
comments are).
"""

from __future__ import annotations

import ast
from pathlib import Path

import roll_ma

MAX_LINES = 80


def long_functions(root: Path, max_lines: int = MAX_LINES) -> list[str]:
    """``path:line name (N lines)`` of every function or method under ``root`` longer than ``max_lines``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > max_lines:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_in_roll_ma_is_over_80_lines():
    too_long = long_functions(Path(roll_ma.__file__).parent)
    assert not too_long, f"over {MAX_LINES} lines; split each into named steps:\n" + "\n".join(too_long)


def test_the_check_names_a_long_function(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    (package / "mod.py").write_text(f"def short():\n    pass\n\n\n@staticmethod\ndef long():\n{body}\n")
    assert long_functions(package) == ["pkg/mod.py:6 long (81 lines)"]
