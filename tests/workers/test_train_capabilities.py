"""A train backend needs only the core Protocol; joint search, DPO and phases are capabilities it may lack,
and a run that needs one the backend lacks fails naming the capability and the config that asks for it."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from train_helpers import make_batch, worker_spec

from roll_ma.config.schema import AgentConfig, ModelConfig, TrainConfig
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import ScoreRequest, UpdateResult
from roll_ma.training.deepspeed_train import DeepSpeedTrainStrategy
from roll_ma.training.multi_agent_deepspeed import MultiAgentDeepSpeedStrategy
from roll_ma.training.train_backend import DPOCapable, PhaseCapable, TrainBackend
from roll_ma.workers.train_worker import TrainWorker, check_capabilities


class CoreOnly:
    """A backend with the core methods only: each one handed to a real backend, nothing more."""

    def __init__(self, inner: TrainBackend):
        self.inner, self.model = inner, inner.model

    def initialize(self, total_steps: int | None = None) -> None:
        self.inner.initialize(total_steps)

    def compute_log_probs(self, data: DataProto, adapters_enabled: bool = True, temperature: float = 1.0,
                          with_entropy: bool = False) -> DataProto:
        return self.inner.compute_log_probs(data, adapters_enabled, temperature, with_entropy)

    def compute_values(self, data: DataProto) -> DataProto:
        return self.inner.compute_values(data)

    def train_step(self, data: DataProto) -> UpdateResult:
        return self.inner.train_step(data)

    def adapter_tensors(self, adapters: list[str] | None = None, packed: bool = False,
                        dtype: str | None = None, shared: Any = None) -> dict[str, Any]:
        return self.inner.adapter_tensors(adapters, packed, dtype, shared)

    def save_checkpoint(self, ckpt_dir: str | os.PathLike) -> None:
        self.inner.save_checkpoint(ckpt_dir)

    def load_checkpoint(self, ckpt_dir: str | os.PathLike) -> None:
        self.inner.load_checkpoint(ckpt_dir)


@pytest.mark.parametrize("backend", [MultiAgentDeepSpeedStrategy, DeepSpeedTrainStrategy])
def test_the_built_in_backends_have_every_capability(backend):
    assert all(issubclass(backend, c) for c in (PhaseCapable, DPOCapable))
    assert not any(issubclass(CoreOnly, c) for c in (PhaseCapable, DPOCapable))


def test_a_core_only_backend_scores_and_refuses_each_capability_by_name(tiny_model_dir, adapter_init_dir):
    agents = [AgentConfig(name=n, init_adapter=adapter_init_dir(n)) for n in ("a0", "a1")]
    spec = worker_spec(ModelConfig(path=tiny_model_dir), agents, train=TrainConfig(micro_batch_size=3))
    worker = TrainWorker("train", spec=spec)
    worker.init_model()
    batch = make_batch([0, 1, 1, 0], seed=61)
    full = worker.compute_log_probs(batch, ScoreRequest()).batch["old_log_probs"]
    worker.strategy = CoreOnly(worker._strategy())
    assert torch.equal(worker.compute_log_probs(batch, ScoreRequest()).batch["old_log_probs"], full)

    from roll_ma.studies.joint_search_train import score_choices  # a study's pass checks its backend

    with pytest.raises(ValueError, match=r"study.joint_search_every > 0: .*policy set .*not a CoreOnly"):
        worker.score_with(score_choices, batch)
    with pytest.raises(ValueError, match=r"a dpo phase needs .* DPOCapable capability"):
        worker.snapshot_reference()
    with pytest.raises(ValueError, match=r"phases needs .* PhaseCapable capability \(reset_optimizers\)"):
        worker.reset_optimizers()


def test_a_config_needing_a_missing_capability_is_refused_before_the_model_is_built():
    backend = object.__new__(CoreOnly)  # the check reads the class's methods only
    with pytest.raises(ValueError, match=r"a dpo phase needs .*DPOCapable"):
        check_capabilities(backend, "my_backend", reference_copies=True)
    check_capabilities(backend, "my_backend", reference_copies=False)  # a plain RL run: fine
