"""multi_agent_deepspeed: one LoRA adapter per agent on one shared base, with every capability plugged in.

The core (``policy_set.PolicySet``: the engines and optimizers, the update, scoring, the adapters out,
checkpoints, the value critic) plus two collaborators it does not import, each a few functions over the
policy set:

- DPO's reference (``dpo_reference.py``): the pair reference log-probs and the frozen adapter copies;
- the studies' joint search (``study_joint_search.py``): scoring a game's legal answers and distilling the
  searched joint policy.

``DeepSpeedTrainStrategy`` (deepspeed_train) is this class with a single policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import PairReference
from roll_ma.training import dpo_reference, study_joint_search
from roll_ma.training.policy_set import PolicySet
from roll_ma.training.train_backend import (
    DPOCapable,
    JointSearchCapable,
    PhaseCapable,
    TrainBackend,
    TrainTraits,
)


class MultiAgentDeepSpeedStrategy(PolicySet):
    """Per-agent LoRA training with DeepSpeed (``PolicySet``), plus DPO's reference and joint search.

    Same constructor as ``PolicySet``.
    """

    traits = TrainTraits()  # one adapter per trainable agent; LoRA only

    # ------------------------------------------------------------------ DPO (DPOCapable)
    def compute_pair_ref_log_probs(self, data: DataProto, reference: PairReference = "copy") -> DataProto:
        """(N,) ``ref_chosen_logps`` and ``ref_rejected_logps`` of DPO pair rows, under each row's frozen
        adapter copy ("copy") or the base ("base"): ``dpo_reference.pair_ref_log_probs``."""
        return dpo_reference.pair_ref_log_probs(self, data, reference)

    def snapshot_reference(self) -> list[str]:
        """Copy every trainable adapter into its frozen reference copy (``dpo_reference.py``)."""
        return dpo_reference.snapshot_reference(self)

    # ------------------------------------------------------------------ joint search (JointSearchCapable)
    def score_choices(self, data: DataProto) -> DataProto:
        """(B, K) ``choice_log_probs`` of each row's legal answers: ``study_joint_search.score_choices``."""
        return study_joint_search.score_choices(self, data)

    def distill_choices(self, data: DataProto, max_steps: int, stop_prob: float) -> dict[str, float]:
        """Teach every row's agent its ``target_action``: ``study_joint_search.distill_choices``."""
        return study_joint_search.distill_choices(self, data, max_steps, stop_prob)


if TYPE_CHECKING:  # mypy checks the class against the core and every capability it claims (the worker
    # calls it only through these Protocols)
    _conforms: type[TrainBackend] = MultiAgentDeepSpeedStrategy
    _phases: type[PhaseCapable] = MultiAgentDeepSpeedStrategy
    _dpo: type[DPOCapable] = MultiAgentDeepSpeedStrategy
    _joint_search: type[JointSearchCapable] = MultiAgentDeepSpeedStrategy
