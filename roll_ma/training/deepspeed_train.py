"""deepspeed_train: one policy with DeepSpeed, as LoRA (the agents share one adapter) or full fine-tuning.

It is the multi-agent strategy with a single policy: the same engine, update loop, data
parallelism and checkpoint code; only what the policy is made of changes. With
``train.full_finetune`` the policy is every base weight (no adapters, one engine, ZeRO 0-2;
the checkpoint then holds the model under ``model/``), and reference log-probs must come
from a reference worker, because the base weights move.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from roll_ma.training.multi_agent_deepspeed import MultiAgentDeepSpeedStrategy
from roll_ma.training.policy_weights import FullWeights, LoraWeights
from roll_ma.training.train_backend import (
    DPOCapable,
    PhaseCapable,
    TrainBackend,
    TrainTraits,
)


class DeepSpeedTrainStrategy(MultiAgentDeepSpeedStrategy):
    """One policy: a single trainable adapter shared by every trainable agent, or all weights.

    Same constructor as ``MultiAgentDeepSpeedStrategy``. Frozen agents may keep adapters of
    their own (a fixed opponent); at most one adapter trains.
    """

    traits = TrainTraits(trains_one_policy=True, supports_full_finetune=True)

    def _make_weights(self) -> LoraWeights | FullWeights:
        if self.train_cfg.full_finetune:
            if self.reference_copies:
                raise ValueError("full fine-tuning has no adapter to copy for a DPO reference; set "
                                 "dpo.reference=base with a LoRA policy, or train LoRA adapters")
            return FullWeights(self.model_cfg)
        trainable = sorted({a.adapter for a in self.agents if not a.frozen})
        if len(trainable) > 1:
            raise ValueError(f"deepspeed_train trains one policy but adapters {trainable} are trainable; use "
                             "train.strategy=multi_agent_deepspeed or let the agents share one adapter")
        return self._lora_weights()


if TYPE_CHECKING:  # mypy checks the class against the core and every capability it claims
    _conforms: type[TrainBackend] = DeepSpeedTrainStrategy
    _phases: type[PhaseCapable] = DeepSpeedTrainStrategy
    _dpo: type[DPOCapable] = DeepSpeedTrainStrategy
