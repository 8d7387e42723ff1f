"""What a driver asks of a worker besides the batch: typed requests, passed next to the ``DataProto``.

The batch holds the data (its columns, per-batch facts such as ``pad_id``); how to treat it (which
objective, which step, which policies, which reference) travels as one of these frozen dataclasses, so
mypy checks it where the call is written and a worker never reads a control flag out of ``meta_info``.
The pipeline builds them (``pipelines/``), the clients carry them (``workers/clients.py``), the train
backends read them (``training/``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Objective = Literal["ppo", "sft", "dpo"]  # training/objectives.py: objective_named
PairReference = Literal["copy", "base"]  # DPO's reference: each adapter's frozen copy, or the base


@dataclass(frozen=True)
class ScoreRequest:
    """A scoring pass (old, reference log-probs): the sampling temperature the rows were drawn at."""

    temperature: float = 1.0


@dataclass(frozen=True)
class DPOSettings:
    """A dpo update's loss settings (a phase's ``dpo.beta``, ``dpo.label_smoothing``, ``dpo.rpo_alpha``)."""

    beta: float
    label_smoothing: float = 0.0
    rpo_alpha: float = 0.0


@dataclass(frozen=True)
class UpdateRequest:
    """One train step: what to optimise, at which step, and which policies take part.

    Args:
        step: the run's step (``update_every`` of each agent, lr and entropy schedules).
        temperature: the rollout's sampling temperature (the policy loss scores at it).
        objective: ppo (the RL loop), sft or dpo (supervised phases).
        policies: update only these adapters (the streamed sync updates one per call); None: every due one.
        critic_only: only the value critic trains (``critic.warmup_steps``); every agent waits.
        behavior_correction: the rows may come from older adapters (``rollout.max_staleness`` > 0): the
            decoupled PPO objective weighs them by pi_old / pi_rollout.
        dpo: the DPO loss's settings; required by ``objective="dpo"``.
    """

    step: int = 0
    temperature: float = 1.0
    objective: Objective = "ppo"
    policies: tuple[str, ...] | None = None
    critic_only: bool = False
    behavior_correction: bool = False
    dpo: DPOSettings | None = None

    def __post_init__(self) -> None:
        if self.objective == "dpo" and self.dpo is None:
            raise ValueError("a dpo update needs its loss settings: UpdateRequest(objective='dpo', "
                             "dpo=DPOSettings(beta=...))")
