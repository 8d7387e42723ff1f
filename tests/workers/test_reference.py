"""Both reference paths (a reference worker holding the base, the train worker with adapters off) agree."""

from __future__ import annotations

import torch
from train_helpers import make_batch, worker_spec

from roll_ma.config.schema import AgentConfig, ModelConfig, TrainConfig
from roll_ma.protocol.requests import ScoreRequest
from roll_ma.training.micro_batches import MicroBatching
from roll_ma.workers.reference_worker import ReferenceWorker
from roll_ma.workers.train_worker import TrainWorker
from roll_ma.workers.worker_specs import ReferenceWorkerSpec


def test_reference_worker_equals_train_worker_with_adapters_off(tiny_model_dir, adapter_init_dir):
    model_cfg = ModelConfig(path=tiny_model_dir)
    agents = [AgentConfig(name=n, init_adapter=adapter_init_dir(n)) for n in ("a0", "a1")]
    train = TrainWorker("train", spec=worker_spec(model_cfg, agents, train=TrainConfig(micro_batch_size=3)))
    train.init_model()
    ref = ReferenceWorker("reference", spec=ReferenceWorkerSpec(model_cfg, MicroBatching(max_rows=5)))
    ref.init_model()
    batch = make_batch([0, 1, 1, 0, 1, 0, 0], seed=60)
    request = ScoreRequest(temperature=0.7)

    from_train = train.compute_ref_log_probs(batch, request).batch["ref_log_probs"]
    from_ref = ref.compute_ref_log_probs(batch, request).batch["ref_log_probs"]
    assert from_train.shape == from_ref.shape == batch.batch["responses"].shape
    assert from_train.dtype == torch.float32
    assert torch.allclose(from_train, from_ref, atol=1e-5, rtol=0)
    # and the adapters really are on otherwise (nonzero lora_B): the old log-probs differ from the reference
    old = train.compute_log_probs(batch, request).batch["old_log_probs"]
    mask = batch.batch["response_mask"].bool()
    assert (old - from_ref)[mask].abs().max() > 1e-4
