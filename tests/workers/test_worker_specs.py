"""A train or reference worker is built from one typed spec: a missing, unknown or mistyped setting is
refused where the spec is made, naming it; the worker fills in no default of its own."""

from __future__ import annotations

import pytest

from roll_ma.config.run_plan import run_plan
from roll_ma.config.schema import (
    AgentConfig,
    AlgorithmConfig,
    CriticConfig,
    LoraConfig,
    ModelConfig,
    RunConfig,
    StudyConfig,
    TrainConfig,
)
from roll_ma.training.micro_batches import MicroBatching
from roll_ma.workers.reference_worker import ReferenceWorker
from roll_ma.workers.train_worker import TrainWorker
from roll_ma.workers.worker_specs import ReferenceWorkerSpec, TrainWorkerSpec

SETTINGS = {"model": ModelConfig(), "lora": LoraConfig(), "agents": [AgentConfig(name="a0")],
            "train": TrainConfig(), "algorithm": AlgorithmConfig(), "critic": CriticConfig(),
            "study": StudyConfig(), "seed": 3, "reference_copies": False}


def test_a_spec_of_every_setting_is_built_and_read_by_the_worker_as_given():
    spec = TrainWorkerSpec.from_settings(SETTINGS)
    assert spec.agents == (AgentConfig(name="a0"),) and spec.seed == 3
    assert TrainWorker("train", spec=spec).spec is spec


def test_a_forgotten_setting_is_refused_by_name():
    settings = {k: v for k, v in SETTINGS.items() if k != "critic"}
    with pytest.raises(ValueError, match=r"train worker spec: missing setting 'critic'$"):
        TrainWorkerSpec.from_settings(settings)
    with pytest.raises(TypeError, match="critic"):  # the dataclass itself has no default either
        TrainWorkerSpec(**{**settings, "agents": tuple(settings["agents"])})  # type: ignore[arg-type]


def test_an_unknown_setting_is_refused_with_the_closest_name():
    with pytest.raises(ValueError, match=r"unknown setting 'algo_cfg'; missing setting 'algorithm'"):
        TrainWorkerSpec.from_settings({**{k: v for k, v in SETTINGS.items() if k != "algorithm"},
                                       "algo_cfg": AlgorithmConfig()})
    with pytest.raises(ValueError, match=r"unknown setting 'critc' \(did you mean 'critic'\?\)"):
        TrainWorkerSpec.from_settings({**SETTINGS, "critc": CriticConfig()})


def test_a_setting_of_the_wrong_kind_is_refused_by_name():
    with pytest.raises(ValueError, match="train must be a TrainConfig, got dict"):
        TrainWorkerSpec.from_settings({**SETTINGS, "train": {"lr": 1e-5}})
    with pytest.raises(ValueError, match="seed must be a int, got bool"):
        TrainWorkerSpec.from_settings({**SETTINGS, "seed": True})
    with pytest.raises(ValueError, match="agents is empty"):
        TrainWorkerSpec.from_settings({**SETTINGS, "agents": []})
    with pytest.raises(ValueError, match=r"agents\[1\] must be an AgentConfig, got str"):
        TrainWorkerSpec.from_settings({**SETTINGS, "agents": [AgentConfig(name="a0"), "a1"]})


def test_an_undecided_prompt_sharing_is_refused_and_the_plans_choice_accepted():
    packed = TrainConfig(remove_padding=True)  # share_prompt_prefix=auto
    with pytest.raises(ValueError, match="train.share_prompt_prefix is auto"):
        TrainWorkerSpec.from_settings({**SETTINGS, "train": packed})
    plan = run_plan(RunConfig(train=packed))
    spec = TrainWorkerSpec.from_settings({**SETTINGS, "train": plan.worker_train_config(packed)})
    assert spec.train.share_prompt_prefix is True


def test_a_worker_refuses_anything_but_a_spec():
    with pytest.raises(TypeError, match="built from a TrainWorkerSpec, got dict"):
        TrainWorker("train", spec=SETTINGS)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        TrainWorker("train", model_cfg=ModelConfig())  # type: ignore[call-arg]


def test_a_reference_worker_takes_its_scoring_batching_and_nothing_it_does_not_read():
    spec = ReferenceWorkerSpec.from_settings({"model": ModelConfig(), "batching": MicroBatching(max_rows=5)})
    assert ReferenceWorker("reference", spec=spec).spec.batching.max_rows == 5
    with pytest.raises(ValueError, match=r"reference worker spec: unknown setting 'micro_batch_size'; "
                                         r"missing setting 'batching'"):
        ReferenceWorkerSpec.from_settings({"model": ModelConfig(), "micro_batch_size": 5})
    with pytest.raises(ValueError, match="batching must be a MicroBatching, got int"):
        ReferenceWorkerSpec(ModelConfig(), 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="built from a ReferenceWorkerSpec"):
        ReferenceWorker("reference", spec={"model": ModelConfig()})  # type: ignore[arg-type]
