"""Every module of roll_ma has a file name of its own: a traceback, an import line or a search for
``run.py`` names one file, and the name says what that module is (``pipelines/rl/rl_run.py`` beside the
API's ``run.py``, ``envs/env_registry.py`` beside the plug-point ``registry.py``). Packages' ``__init__.py``
excepted."""

from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "roll_ma"


def test_no_two_modules_share_a_file_name():
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name != "__init__.py":
            where[path.name].append(str(path.relative_to(PACKAGE.parent)))
    shared = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not shared, f"give each a name that says what it is: {shared}"
