"""What a worker is built with: one typed spec per role, every setting named and none defaulted
(``TrainWorkerSpec``, ``ReferenceWorkerSpec``, ``RolloutWorkerSpec``, ``EnvWorkerSpec``,
``WorkflowWorkerSpec``).

The driver builds each from the run's config and plan (``pipelines/clusters.py``); the worker reads nothing
else. A forgotten, misspelt or mistyped setting is refused where the spec is made, naming the setting,
before any actor starts: a worker never runs with a default it filled in itself.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from roll_ma.config.schema import (
    AgentConfig,
    AlgorithmConfig,
    CriticConfig,
    EnvConfig,
    LoraConfig,
    ModelConfig,
    RolloutConfig,
    StudyConfig,
    TrainConfig,
)
from roll_ma.config.typed import suggest
from roll_ma.training.micro_batches import MicroBatching
from roll_ma.training.update_loop import LossTermMaker

SpecT = TypeVar("SpecT", bound="WorkerSpec")


class WorkerSpec:
    """What every role's spec shares: each setting checked against its type, and ``from_settings``."""

    ROLE: ClassVar[str]

    @classmethod
    def setting_types(cls) -> dict[str, type]:
        """What each setting must be, read from the dataclass's fields (``tuple[X, ...]``: a tuple)."""
        hints = typing.get_type_hints(cls)
        return {f.name: typing.get_origin(hints[f.name]) or hints[f.name]
                for f in dataclasses.fields(cls)}  # type: ignore[arg-type]

    def __post_init__(self) -> None:
        problems = [f"{name} must be a {want.__name__}, got {type(getattr(self, name)).__name__}"
                    for name, want in self.setting_types().items() if not _is(getattr(self, name), want)]
        problems += self.problems() if not problems else []
        if problems:
            raise ValueError(f"{self.ROLE} worker spec: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """What is wrong beyond the settings' types (each well typed when this runs)."""
        return []

    @classmethod
    def from_settings(cls: type[SpecT], settings: Mapping[str, Any]) -> SpecT:
        """The spec of ``settings`` (a dict of setting -> value; a sequence where a tuple is wanted),
        refusing a missing or unknown setting by name (and the closest known one)."""
        names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        problems = [f"unknown setting {key!r}{suggest(key, names)}" for key in settings if key not in names]
        problems += [f"missing setting {name!r}" for name in names if name not in settings]
        if problems:
            raise ValueError(f"{cls.ROLE} worker spec: " + "; ".join(problems))
        types = cls.setting_types()
        values = {k: tuple(v) if types[k] is tuple and isinstance(v, (list, tuple)) else v
                  for k, v in settings.items()}
        return cls(**values)


@dataclass(frozen=True)
class TrainWorkerSpec(WorkerSpec):
    """Every setting of a train worker.

    Attributes:
        model: the shared base model (``model``).
        lora: the default LoRA block; each agent's overrides sit on its ``AgentConfig``.
        agents: every agent, index = ``agent_id`` (at least one).
        train: the train block as the workers run it: ``share_prompt_prefix`` decided true or false
            (``RunPlan.worker_train_config``) wherever rows are packed.
        algorithm: loss settings (``algorithm``).
        critic: the value critic's settings (``critic``; read with ``algorithm.advantage=gae``).
        study: the study settings the update passes on to its extra loss terms (``study``).
        loss_terms: a study's extra terms of the PPO loss, their makers (``LossTermMaker``; the driver takes
            those the run plan names from ``roll_ma.studies``' registrations: Ray imports their module here).
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
    loss_terms: tuple[LossTermMaker, ...]
    seed: int
    reference_copies: bool

    ROLE = "train"

    def problems(self) -> list[str]:
        found = _agent_problems(self.agents)
        if not self.agents:
            found.append("agents is empty: a train worker trains at least one agent")
        if self.train.share_prompt_prefix == "auto" and self.train.remove_padding:
            found.append("train.share_prompt_prefix is auto: give the worker the run plan's choice "
                         "(RunPlan.worker_train_config)")
        return found


@dataclass(frozen=True)
class ReferenceWorkerSpec(WorkerSpec):
    """Every setting of a reference worker (the base model alone, scoring reference log-probs).

    Attributes:
        model: the base model (``model``; its weights as loaded, nothing drawn at random).
        batching: how rows are split into micro-batches: the run's scoring budget, as the train workers
            score (``MicroBatching.for_scoring`` of the plan's train block).
    """

    model: ModelConfig
    batching: MicroBatching

    ROLE = "reference"


@dataclass(frozen=True)
class RolloutWorkerSpec(WorkerSpec):
    """Every setting of a rollout worker (one inference engine serving every agent's adapter).

    Attributes:
        model: the base model the engine serves (``model``; a teacher's own ``teacher.model``).
        lora: the default LoRA block; each agent's overrides sit on its ``AgentConfig``.
        agents: every agent, index = ``agent_id`` (empty: a teacher serving the base model alone).
        rollout: backend, sampling defaults and engine settings (``rollout``, or ``teacher.rollout``).
        seed: the run seed (the trainer's: version 0 adapters drawn by the engine match the trainer's).
    """

    model: ModelConfig
    lora: LoraConfig
    agents: tuple[AgentConfig, ...]
    rollout: RolloutConfig
    seed: int

    ROLE = "rollout"

    def problems(self) -> list[str]:
        return _agent_problems(self.agents)


@dataclass(frozen=True)
class EnvWorkerSpec(WorkerSpec):
    """Every setting of an env worker (turn-based envs and games, played against the rollout workers).

    Attributes:
        env: the env, its episodes and turn budget (``env``; no ``env.workflow``: a workflow worker's).
        model: the model whose tokenizer renders the prompts (``model``; a teacher's own).
        agents: every agent, index = ``agent_id`` (at least one).
        seats: the agent name in each seat (``config.seats.resolve_seats``).
        seed: sampling seeds and the envs' randomness.
        action_choices: tokenize every legal action of a game's turns into the rows (``action_choices``):
            only the entropy bonus over legal actions reads them (``study.action_entropy_coef`` > 0).
    """

    env: EnvConfig
    model: ModelConfig
    agents: tuple[AgentConfig, ...]
    seats: tuple[str, ...]
    seed: int
    action_choices: bool

    ROLE = "env"

    def problems(self) -> list[str]:
        found = _agent_problems(self.agents, at_least_one=True)
        found += [f"seats[{i}] must be a str, got {type(s).__name__}"
                  for i, s in enumerate(self.seats) if not isinstance(s, str)]
        if self.env.workflow:
            found.append(f"env.workflow is {self.env.workflow!r}: a workflow runs in a workflow worker "
                         "(WorkflowWorkerSpec)")
        return found


@dataclass(frozen=True)
class WorkflowWorkerSpec(WorkerSpec):
    """Every setting of a workflow worker (the env worker of runs whose config names ``env.workflow``).

    Attributes:
        env: the env block, naming the workflow, its tools and kwargs (``env``).
        model: the model whose tokenizer renders the prompts (``model``).
        agents: every agent, index = ``agent_id`` (at least one); a workflow calls them by name.
        seed: sampling seeds and each episode's ``rng``.
    """

    env: EnvConfig
    model: ModelConfig
    agents: tuple[AgentConfig, ...]
    seed: int

    ROLE = "workflow"

    def problems(self) -> list[str]:
        found = _agent_problems(self.agents, at_least_one=True)
        if not self.env.workflow:
            found.append("env.workflow is empty: a workflow worker runs the workflow that env.workflow names")
        return found


def expect_spec(spec: Any, want: type[WorkerSpec]) -> None:
    """Refuse a worker built from anything but its role's spec (a dict of settings: ``from_settings``)."""
    if not isinstance(spec, want):
        raise TypeError(f"a {want.ROLE} worker is built from a {want.__name__} "
                        f"({want.__name__}.from_settings(dict) makes one), got {type(spec).__name__}")


def _agent_problems(agents: tuple[AgentConfig, ...], at_least_one: bool = False) -> list[str]:
    found = [f"agents[{i}] must be an AgentConfig, got {type(a).__name__}"
             for i, a in enumerate(agents) if not isinstance(a, AgentConfig)]
    if at_least_one and not agents:
        found.append("agents is empty: the worker plays at least one agent")
    return found


def _is(value: Any, want: type) -> bool:
    if want is int:  # True is an int to Python, not a seed
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, want)
