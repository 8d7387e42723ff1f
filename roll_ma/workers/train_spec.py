"""What a train worker is built with: one typed spec, every setting named and none defaulted.

The driver builds it from the run's config and plan (``pipelines/clusters.py:train_worker_spec``); the
worker reads nothing else. A forgotten or misspelt setting is refused where the spec is made, naming the
setting, before any actor starts: a train worker never trains with a default it filled in itself.
(No torch, no Ray: the driver imports this to build the spec.)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from roll_ma.config.schema import (
    AgentConfig,
    AlgorithmConfig,
    CriticConfig,
    LoraConfig,
    ModelConfig,
    StudyConfig,
    TrainConfig,
)
from roll_ma.config.typed import suggest

# what each setting must be (the dataclass's annotations are strings under ``from __future__``)
SETTING_TYPES: dict[str, type | tuple[type, ...]] = {
    "model": ModelConfig,
    "lora": LoraConfig,
    "agents": tuple,
    "train": TrainConfig,
    "algorithm": AlgorithmConfig,
    "critic": CriticConfig,
    "study": StudyConfig,
    "seed": int,
    "reference_copies": bool,
}


@dataclass(frozen=True)
class TrainWorkerSpec:
    """Every setting of a train worker.

    Attributes:
        model: the shared base model (``model``).
        lora: the default LoRA block; each agent's overrides sit on its ``AgentConfig``.
        agents: every agent, index = ``agent_id`` (at least one).
        train: the train block as the workers run it: ``share_prompt_prefix`` decided true or false
            (``RunPlan.worker_train_config``) wherever rows are packed.
        algorithm: loss settings (``algorithm``).
        critic: the value critic's settings (``critic``; read with ``algorithm.advantage=gae``).
        study: the game-study helpers the update uses (``study``).
        seed: adapter init and mini-batch shuffling.
        reference_copies: hold a frozen copy of every trainable adapter (a DPO phase's reference).
    """

    model: ModelConfig
    lora: LoraConfig
    agents: tuple[AgentConfig, ...]
    train: TrainConfig
    algorithm: AlgorithmConfig
    critic: CriticConfig
    study: StudyConfig
    seed: int
    reference_copies: bool

    def __post_init__(self) -> None:
        problems = [f"{name} must be a {_type_name(want)}, got {type(getattr(self, name)).__name__}"
                    for name, want in SETTING_TYPES.items() if not _is(getattr(self, name), want)]
        if isinstance(self.agents, tuple):
            if not self.agents:
                problems.append("agents is empty: a train worker trains at least one agent")
            problems += [f"agents[{i}] must be an AgentConfig, got {type(a).__name__}"
                         for i, a in enumerate(self.agents) if not isinstance(a, AgentConfig)]
        train = self.train
        if isinstance(train, TrainConfig) and train.share_prompt_prefix == "auto" and train.remove_padding:
            problems.append("train.share_prompt_prefix is auto: give the worker the run plan's choice "
                            "(RunPlan.worker_train_config)")
        if problems:
            raise ValueError("train worker spec: " + "; ".join(problems))

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> TrainWorkerSpec:
        """The spec of ``settings`` (a dict of setting -> value; ``agents`` as any sequence), refusing a
        missing or unknown setting by name (and the closest known one)."""
        names = [f.name for f in dataclasses.fields(cls)]
        problems = [f"unknown setting {key!r}{suggest(key, names)}" for key in settings if key not in names]
        problems += [f"missing setting {name!r}" for name in names if name not in settings]
        if problems:
            raise ValueError("train worker spec: " + "; ".join(problems))
        values = dict(settings)
        if not isinstance(values["agents"], (str, bytes)):
            values["agents"] = tuple(values["agents"])
        return cls(**values)


def _is(value: Any, want: type | tuple[type, ...]) -> bool:
    if want is int:  # True is an int to Python, not a seed
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, want)


def _type_name(want: type | tuple[type, ...]) -> str:
    return want.__name__ if isinstance(want, type) else " or ".join(t.__name__ for t in want)
