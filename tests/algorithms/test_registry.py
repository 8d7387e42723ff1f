"""Advantage estimators and policy losses are looked up by name; an unknown name says what is registered."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from roll_ma.algorithms.advantages import add_advantages
from roll_ma.algorithms.algorithm_registry import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    Registry,
    register_advantage_estimator,
)
from roll_ma.algorithms.losses import ppo_clip_loss
from roll_ma.config.schema import AlgorithmConfig
from roll_ma.protocol import DataProto


def turn_rows(scores: list[float]) -> DataProto:
    """One turn per row, each its own episode, all of agent 0 in one group; responses of 2 tokens."""
    n = len(scores)
    return DataProto.from_dict(
        {"scores": torch.tensor(scores), "response_mask": torch.ones(n, 2)},
        {"episode_id": [f"e{i}" for i in range(n)], "player": [0] * n, "turn": [0] * n,
         "agent_id": [0] * n, "group_id": ["g"] * n},
    )


def test_the_built_ins_are_registered():
    assert {"grpo", "reinforce_pp", "gae"} <= set(ADVANTAGE_ESTIMATORS.names())
    assert "ppo_clip" in POLICY_LOSSES.names()
    assert AlgorithmConfig().advantage in ADVANTAGE_ESTIMATORS.names()
    assert AlgorithmConfig().policy_loss in POLICY_LOSSES.names()


def test_an_unknown_name_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"advantage='grpoo'.*registered: .*gae, grpo, reinforce_pp"):
        add_advantages(turn_rows([1.0, 0.0]), AlgorithmConfig(advantage="grpoo"))
    with pytest.raises(ValueError, match=r"policy_loss='clip'.*registered:.*ppo_clip.*register_policy_loss"):
        POLICY_LOSSES.get("clip")


def test_a_name_is_registered_once():
    table: Registry = Registry("thing", "x.thing", "register_thing", also=("reserved",))
    table.register("a")(len)
    table.register("a")(len)  # the same function again (a module imported twice) is fine
    with pytest.raises(ValueError, match="already registered"):
        table.register("a")(abs)
    with pytest.raises(ValueError, match="already registered"):
        table.register("reserved")(abs)


@register_advantage_estimator("centred")
def centred(returns: np.ndarray, rows, algo) -> np.ndarray:
    """Returns minus the batch mean, no grouping: a user's estimator."""
    return returns - returns.mean()


def test_a_registered_estimator_computes_the_advantages():
    out = add_advantages(turn_rows([1.0, 0.0, 0.0, 0.0]), AlgorithmConfig(advantage="centred"))
    assert out.batch["advantages"][:, 0].tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25])
    assert out.batch["advantages"][:, 1].tolist() == out.batch["advantages"][:, 0].tolist()  # every token


def test_ppo_clip_passes_the_config_through():
    gen = torch.Generator().manual_seed(0)
    lp, old, adv = (torch.randn(3, 4, generator=gen) for _ in range(3))
    mask = torch.ones(3, 4)
    algo = AlgorithmConfig(clip_ratio_low=0.1, clip_ratio_high=0.3, loss_agg="seq_mean")
    ours, stats = POLICY_LOSSES.get("ppo_clip")(lp, old, adv, mask, algo, 2.0, None)
    direct, direct_stats = ppo_clip_loss(lp, old, adv, mask, 0.1, 0.3, "seq_mean", 2.0)
    assert torch.equal(ours, direct) and stats == direct_stats


def test_a_study_plug_is_found_by_name_and_its_absence_is_named_by_the_setting_that_asked():
    from roll_ma.registry import StudyPlugs

    plugs: StudyPlugs[object] = StudyPlugs("PPO loss term")
    term, other = object(), object()
    plugs.register("bonus", term)
    plugs.register("bonus", term)  # the studies imported again: the same object is fine
    with pytest.raises(ValueError, match="'bonus' is registered already"):
        plugs.register("bonus", other)
    assert plugs.get("bonus", "study.bonus_coef > 0") is term
    refused = r"^study.x_coef > 0: the PPO loss term 'x' .* import roll_ma.studies"
    with pytest.raises(ValueError, match=refused):
        plugs.get("x", "study.x_coef > 0")
