"""Every worker (train, reference, rollout, env, workflow) is built from one typed spec: a missing, unknown
or mistyped setting is refused where the spec is made, naming it; the worker fills in no default of its
own."""

from __future__ import annotations

import pytest

from roll_ma.config.run_plan import run_plan
from roll_ma.config.schema import (
    AgentConfig,
    AlgorithmConfig,
    CriticConfig,
    EnvConfig,
    LoraConfig,
    ModelConfig,
    RolloutConfig,
    RunConfig,
    StudyConfig,
    TrainConfig,
)
from roll_ma.training.micro_batches import MicroBatching
from roll_ma.workers.env_worker import EnvWorker
from roll_ma.workers.reference_worker import ReferenceWorker
from roll_ma.workers.rollout_worker import RolloutWorker
from roll_ma.workers.train_worker import TrainWorker
from roll_ma.workers.worker_specs import (
    EnvWorkerSpec,
    ReferenceWorkerSpec,
    RolloutWorkerSpec,
    TrainWorkerSpec,
    WorkflowWorkerSpec,
)
from roll_ma.workers.workflow_worker import WorkflowWorker

SETTINGS = {"model": ModelConfig(), "lora": LoraConfig(), "agents": [AgentConfig(name="a0")],
            "train": TrainConfig(), "algorithm": AlgorithmConfig(), "critic": CriticConfig(),
            "study": StudyConfig(), "loss_terms": (), "seed": 3, "reference_copies": False}


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


# ---------------------------------------------------------------- rollout, env and workflow workers
ROLLOUT = {"model": ModelConfig(), "lora": LoraConfig(), "agents": [AgentConfig(name="a0")],
           "rollout": RolloutConfig(), "seed": 3}
ENV = {"env": EnvConfig(name="tiny_hanabi"), "model": ModelConfig(), "agents": [AgentConfig(name="a0")],
       "seats": ["a0", "a0"], "seed": 3, "action_choices": False}
WORKFLOW = {"env": EnvConfig(workflow="examples/workflows/any.py:play"), "model": ModelConfig(),
            "agents": [AgentConfig(name="a0")], "seed": 3}
NEW_SPECS = [(RolloutWorkerSpec, ROLLOUT, "rollout"), (EnvWorkerSpec, ENV, "env"),
             (WorkflowWorkerSpec, WORKFLOW, "workflow")]


@pytest.mark.parametrize("cls, settings, role", NEW_SPECS)
def test_each_new_spec_refuses_a_missing_setting_by_name(cls, settings, role):
    for name in settings:
        with pytest.raises(ValueError, match=rf"^{role} worker spec: missing setting '{name}'$"):
            cls.from_settings({k: v for k, v in settings.items() if k != name})
    with pytest.raises(TypeError, match="seed"):  # the dataclass has no default either
        cls(**{k: v for k, v in settings.items() if k != "seed"})


@pytest.mark.parametrize("cls, settings, role", NEW_SPECS)
def test_each_new_spec_refuses_an_unknown_setting_with_the_closest_name(cls, settings, role):
    unknown = rf"^{role} worker spec: unknown setting 'sed' \(did you mean 'seed'\?\)$"
    with pytest.raises(ValueError, match=unknown):
        cls.from_settings({**settings, "sed": 3})
    # the old keyword arguments of the worker are unknown settings now, each named
    with pytest.raises(ValueError, match=r"unknown setting 'model_cfg' \(did you mean 'model'\?\); "
                                         r"missing setting 'model'"):
        cls.from_settings({**{k: v for k, v in settings.items() if k != "model"}, "model_cfg": ModelConfig()})


@pytest.mark.parametrize("cls, settings, role", NEW_SPECS)
def test_each_new_spec_is_built_from_every_setting_and_refuses_a_wrong_kind(cls, settings, role):
    spec = cls.from_settings(settings)
    assert spec.agents == (AgentConfig(name="a0"),) and spec.seed == 3  # a list reaches it as a tuple
    with pytest.raises(ValueError, match=rf"{role} worker spec: model must be a ModelConfig, got dict"):
        cls.from_settings({**settings, "model": {"path": "x"}})
    with pytest.raises(ValueError, match=r"agents\[0\] must be an AgentConfig, got str"):
        cls.from_settings({**settings, "agents": ["a0"]})


def test_the_env_specs_refuse_what_their_worker_cannot_play():
    with pytest.raises(ValueError, match="env worker spec: agents is empty"):
        EnvWorkerSpec.from_settings({**ENV, "agents": []})
    with pytest.raises(ValueError, match=r"seats\[1\] must be a str, got int"):
        EnvWorkerSpec.from_settings({**ENV, "seats": ["a0", 1]})
    with pytest.raises(ValueError, match="env.workflow is .*: a workflow runs in a workflow worker"):
        EnvWorkerSpec.from_settings({**ENV, "env": WORKFLOW["env"]})
    with pytest.raises(ValueError, match="workflow worker spec: env.workflow is empty"):
        WorkflowWorkerSpec.from_settings({**WORKFLOW, "env": EnvConfig(name="tiny_hanabi")})
    with pytest.raises(ValueError, match="action_choices must be a bool, got int"):
        EnvWorkerSpec.from_settings({**ENV, "action_choices": 1})
    assert RolloutWorkerSpec.from_settings({**ROLLOUT, "agents": []}).agents == ()  # a teacher: no adapters


@pytest.mark.parametrize("worker, spec_cls", [(RolloutWorker, RolloutWorkerSpec), (EnvWorker, EnvWorkerSpec),
                                              (WorkflowWorker, WorkflowWorkerSpec)])
def test_the_rollout_env_and_workflow_workers_refuse_anything_but_their_spec(worker, spec_cls):
    with pytest.raises(TypeError, match=rf"built from a {spec_cls.__name__} .*got dict"):
        worker("w", spec=dict(ROLLOUT))
    with pytest.raises(TypeError):  # the old keyword arguments are gone
        worker("w", model_cfg=ModelConfig())


def test_the_driver_builds_each_role_spec_from_the_config():
    from roll_ma.pipelines.clusters import env_worker_spec, rollout_worker_spec, teacher_env_spec

    cfg = RunConfig(agents=[AgentConfig(name="a0"), AgentConfig(name="a1")],
                    env=EnvConfig(name="tiny_hanabi"), study=StudyConfig(action_entropy_coef=0.1))
    rollout = rollout_worker_spec(cfg, cfg.model, cfg.rollout, agents=True)
    assert rollout.agents == tuple(cfg.agents) and rollout.rollout is cfg.rollout and rollout.seed == cfg.seed
    assert rollout_worker_spec(cfg, cfg.model, cfg.rollout, agents=False).agents == ()
    env = env_worker_spec(cfg, ["a0", "a1"], cfg.model)
    assert isinstance(env, EnvWorkerSpec) and env.seats == ("a0", "a1") and env.action_choices is True
    assert teacher_env_spec(cfg, ["a0", "a1"]).action_choices is False
    flow = env_worker_spec(RunConfig(agents=cfg.agents, env=WORKFLOW["env"]), [], cfg.model)
    assert isinstance(flow, WorkflowWorkerSpec) and flow.env.workflow == WORKFLOW["env"].workflow
