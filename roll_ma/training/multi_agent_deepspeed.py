"""multi_agent_deepspeed: one LoRA adapter per agent on one shared base, with every capability plugged in.

The core (``policy_set.PolicySet``: the engines and optimizers, the update, scoring, the adapters out,
checkpoints, the value critic) plus DPO's reference (``dpo_reference.py``: the pair reference log-probs and
the frozen adapter copies), a collaborator it does not import, a few functions over the policy set. The
studies' joint search (``roll_ma/studies/joint_search_train.py``) is no part of it: its functions reach the
policy set through the train worker's ``score_with`` / ``train_with``.

``DeepSpeedTrainStrategy`` (deepspeed_train) is this class with a single policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import PairReference
from roll_ma.training import dpo_reference
from roll_ma.training.policy_set import PolicySet
from roll_ma.training.train_backend import (
    DPOCapable,
    PhaseCapable,
    TrainBackend,
    TrainTraits,
)


class MultiAgentDeepSpeedStrategy(PolicySet):
    """Per-agent LoRA training with DeepSpeed (``PolicySet``), plus DPO's reference.

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


if TYPE_CHECKING:  # mypy checks the class against the core and every capability it claims (the worker
    # calls it only through these Protocols)
    _conforms: type[TrainBackend] = MultiAgentDeepSpeedStrategy
    _phases: type[PhaseCapable] = MultiAgentDeepSpeedStrategy
    _dpo: type[DPOCapable] = MultiAgentDeepSpeedStrategy
