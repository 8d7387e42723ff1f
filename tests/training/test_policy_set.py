"""The trainer's core (policy_set) holds the critic but imports no capability that plugs in: DPO's reference
comes with multi_agent_deepspeed; the studies' joint search (roll_ma.studies) with the train worker's call."""

from __future__ import annotations

import subprocess
import sys

from roll_ma.training.deepspeed_train import DeepSpeedTrainStrategy
from roll_ma.training.multi_agent_deepspeed import MultiAgentDeepSpeedStrategy
from roll_ma.training.policy_set import PolicySet
from roll_ma.training.train_backend import DPOCapable, PhaseCapable


def test_the_core_imports_no_capability_that_plugs_in():
    # DPO's reference and the studies read the policy set: the core importing them is an import cycle
    code = ("import sys, roll_ma.training.policy_set; print(sorted(m for m in sys.modules if "
            "m.startswith('roll_ma.studies') or m == 'roll_ma.training.dpo_reference'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_core_has_phases_and_the_strategies_add_dpo():
    assert issubclass(PolicySet, PhaseCapable)
    assert not issubclass(PolicySet, DPOCapable)
    for strategy in (MultiAgentDeepSpeedStrategy, DeepSpeedTrainStrategy):
        assert issubclass(strategy, PolicySet)
        assert issubclass(strategy, DPOCapable)
