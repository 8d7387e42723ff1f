"""Typed config, the ground floor: schemas, Hydra composition, typing, the generated reference.

It imports nothing of the runtime. The checks across keys and against the runtime, and the loader every
entry point uses, are in the pre-flight layer: ``roll_ma.preflight.config_loader.load_config``."""

from roll_ma.config.compose import available_configs, type_config
from roll_ma.config.schema import (
    AgentConfig,
    AlgorithmConfig,
    DataConfig,
    EnvConfig,
    LoraConfig,
    ModelConfig,
    ReferenceConfig,
    ResourcesConfig,
    RolloutConfig,
    RunConfig,
    StudyConfig,
    TrackingConfig,
    TrainConfig,
    TrainerConfig,
)
from roll_ma.config.seats import resolve_seats
from roll_ma.config.typed import ConfigError, ConfigProblem, to_dataclass

__all__ = [
    "AgentConfig",
    "AlgorithmConfig",
    "ConfigError",
    "ConfigProblem",
    "DataConfig",
    "EnvConfig",
    "LoraConfig",
    "ModelConfig",
    "ReferenceConfig",
    "ResourcesConfig",
    "RolloutConfig",
    "RunConfig",
    "StudyConfig",
    "TrackingConfig",
    "TrainConfig",
    "TrainerConfig",
    "available_configs",
    "resolve_seats",
    "to_dataclass",
    "type_config",
]
