"""The ``algorithm`` block's names: its advantage estimator and policy loss must be registered.

The config keeps plain strings (it imports nothing of the runtime); this check runs with the others before
any actor starts, after the env's module is imported (a module a config names may register its own).
"""

from __future__ import annotations

from typing import Any

# importing them registers the built-in estimators and losses
from roll_ma.algorithms import advantages, losses  # noqa: F401
from roll_ma.algorithms.algorithm_registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES


def unknown_algorithm_names(algo: Any) -> list[tuple[str, str]]:
    """(config key, problem) for each of ``algo.advantage`` / ``algo.policy_loss`` that names nothing
    registered; empty when both are known."""
    found = (
        (table.config_key, table.unknown(name))
        for table, name in ((ADVANTAGE_ESTIMATORS, algo.advantage), (POLICY_LOSSES, algo.policy_loss))
    )
    return [(key, why) for key, why in found if why]
