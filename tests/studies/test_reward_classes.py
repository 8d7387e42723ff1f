"""Advantages balanced over the reward classes an env labels (``studies/reward_classes.py``): the weights by
hand, what ``add_advantages`` does with them, and how the RL step gets them (``roll_ma.studies``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from roll_ma.algorithms.advantages import add_advantages
from roll_ma.config.schema import AlgorithmConfig
from roll_ma.protocol import DataProto
from roll_ma.studies.reward_classes import balance_reward_classes, class_balance_weights


def test_class_balance_weights_by_hand():
    # agent 0: classes a, a, a, b -> shares 3/4 and 1/4, two classes -> a: 0.5 / 0.75 = 2/3, b: 0.5 / 0.25 = 2
    # agent 1: only class a -> weight 1; unlabelled rows -> weight 1
    w = class_balance_weights([0, 0, 0, 0, 1, 1, 0], ["a", "a", "a", "b", "a", "a", ""])
    assert np.allclose(w, [2 / 3, 2 / 3, 2 / 3, 2, 1, 1, 1])
    # each class of agent 0 now weighs the same in total: 3 * 2/3 = 1 * 2
    assert np.isclose(w[:3].sum(), w[3])


def _turns(classes: list[str] | None) -> DataProto:
    """Four one-turn episodes of agent 0, rewards 1, 1, 1, 0 (one group)."""
    columns = {"episode_id": ["e0", "e1", "e2", "e3"], "player": [0] * 4, "turn": [0] * 4,
               "agent_id": [0] * 4, "group_id": ["g"] * 4}
    if classes is not None:
        columns["reward_class"] = classes
    scores = torch.tensor([1.0, 1.0, 1.0, 0.0])
    return DataProto.from_dict({"scores": scores, "response_mask": torch.ones(4, 2)}, columns)


def test_the_advantages_are_weighted_only_where_an_env_labelled_classes():
    algo = AlgorithmConfig()
    plain = add_advantages(_turns(["r", "r", "r", "w"]), algo).batch["advantages"][:, 0]
    balanced = add_advantages(_turns(["r", "r", "r", "w"]), algo, balance_reward_classes).batch["advantages"]
    assert torch.allclose(balanced[:, 0], plain * torch.tensor([2 / 3, 2 / 3, 2 / 3, 2.0]))
    unlabelled = add_advantages(_turns(None), algo, balance_reward_classes).batch["advantages"]
    assert torch.equal(unlabelled, add_advantages(_turns(None), algo).batch["advantages"])


def test_the_rl_step_gets_the_weights_only_once_the_studies_are_imported(monkeypatch):
    import roll_ma.studies  # noqa: F401  (registers the weights)
    from roll_ma.pipelines.rl import rl_run

    assert rl_run.study_advantage_weights("balance_reward_classes") is balance_reward_classes
    assert rl_run.study_advantage_weights(None) is None
    monkeypatch.setattr(rl_run.STUDY_ADVANTAGE_WEIGHTS, "_by_name", {})
    with pytest.raises(ValueError, match=r"study.balance_reward_classes: .* import roll_ma.studies"):
        rl_run.study_advantage_weights("balance_reward_classes")
