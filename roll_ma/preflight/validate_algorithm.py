"""The ``algorithm`` block's plug points: its advantage estimator and policy loss must resolve.

The config keeps plain strings (it imports nothing of the runtime); this check runs with the others before
any actor starts, after the env's module is imported (a module a config names may register its own). A
spec ('path/to/file.py:name', 'pkg.module:name') is imported here as every worker will import it, so a
missing file, a missing name or a function that takes the wrong arguments is reported before Ray starts.
"""

from __future__ import annotations

from typing import Any

from roll_ma.algorithms.algorithm_registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES


def unknown_algorithm_names(algo: Any) -> list[tuple[str, str]]:
    """(config key, problem) for each of ``algo.advantage`` / ``algo.policy_loss`` that does not resolve;
    empty when both do."""
    found = (
        (table.config_key, table.unknown(name))
        for table, name in ((ADVANTAGE_ESTIMATORS, algo.advantage), (POLICY_LOSSES, algo.policy_loss))
    )
    return [(key, why) for key, why in found if why]
