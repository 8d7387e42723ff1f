"""Typed config: schemas, Hydra loading, validation."""

from roll_ma.config.loading import available_configs, load_config
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
from roll_ma.config.typed import ConfigError, ConfigProblem, to_dataclass
from roll_ma.config.validate import resolve_seats

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
    "load_config",
    "resolve_seats",
    "to_dataclass",
]
