"""reward_classes: advantages weighted so each reward class an env labels weighs the same per agent
(``study.balance_reward_classes``).

An env may label a turn's reward with a class (``info['reward_class']``, the rows' ``reward_class``: e.g.
whether the answer a critic judged was right, ``envs/math_selfplay.py``). Where one class dominates an
agent's rows, a verifier learns to give the majority verdict; weighting each class to the same total keeps
both in view. It plugs into the advantages as their row weights (``algorithms/advantages.py``:
``RowWeights``): ``roll_ma.studies`` registers ``balance_reward_classes`` and the RL step hands it to
``add_advantages`` where the run plan names it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def class_balance_weights(agent_ids: Sequence[int], classes: Sequence[str]) -> np.ndarray:
    """(B,) weights making every labelled reward class of an agent weigh the same in total.

    With k classes among an agent's labelled rows, a row of class c gets (1 / k) / share(c);
    unlabelled rows ("") and agents with one class keep weight 1.
    """
    weights = np.ones(len(agent_ids))
    per_agent: dict[int, list[int]] = defaultdict(list)
    for i, (a, c) in enumerate(zip(agent_ids, classes)):
        if c:
            per_agent[int(a)].append(i)
    for rows in per_agent.values():
        labels = [classes[i] for i in rows]
        kinds = sorted(set(labels))
        for c in kinds:
            share = labels.count(c) / len(labels)
            for i in rows:
                if classes[i] == c:
                    weights[i] = (1.0 / len(kinds)) / share
    return weights


def balance_reward_classes(rows: Mapping[str, Any]) -> np.ndarray:
    """(B,) the advantage weights of rows (their non-tensor columns; a ``RowWeights``): each agent's reward
    classes balanced, or 1 everywhere when no env labelled a class."""
    if "reward_class" not in rows:
        return np.ones(len(rows["agent_id"]))
    return class_balance_weights(rows["agent_id"], rows["reward_class"])
