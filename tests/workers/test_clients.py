"""The typed clients (``roll_ma.workers.clients``) without Ray: a real worker behind a LocalCluster, its
backend a recorder. What the pipeline asks (a typed request) must reach the backend as it was sent, and
nothing of it may travel in the batch's meta_info."""

from __future__ import annotations

import pytest
import torch
from local_cluster import LocalCluster
from train_helpers import worker_spec

from roll_ma.config.schema import AgentConfig, ModelConfig
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import DPOSettings, ScoreRequest, UpdateRequest, UpdateResult
from roll_ma.training.micro_batches import MicroBatching
from roll_ma.workers.clients import EnvClient, ReferenceClient, RolloutClient, TrainClient
from roll_ma.workers.env_worker import EnvWorker
from roll_ma.workers.reference_worker import ReferenceWorker
from roll_ma.workers.rollout_worker import RolloutWorker
from roll_ma.workers.train_worker import TrainWorker
from roll_ma.workers.worker_specs import ReferenceWorkerSpec


class RecordingBackend:
    """A TrainBackend that records what the train worker hands it."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []

    def compute_log_probs(self, data, adapters_enabled=True, temperature=1.0, with_entropy=False):
        asked = {"adapters_enabled": adapters_enabled, "temperature": temperature}
        self.calls.append(("compute_log_probs", asked))
        return DataProto.from_dict({"old_log_probs": torch.zeros(len(data), 2)})

    def train_step(self, data, request):
        self.calls.append(("train_step", {"request": request}))
        policies = request.policies or ("a0",)
        return UpdateResult({f"agent/{p}/updated": 1.0 for p in policies}, (0,), tuple(policies))

    def compute_pair_ref_log_probs(self, data, reference="copy"):
        self.calls.append(("compute_pair_ref_log_probs", {"reference": reference}))
        return DataProto.from_dict({"ref_chosen_logps": torch.zeros(len(data))})

    def snapshot_reference(self):  # with compute_pair_ref_log_probs: the DPOCapable capability
        return []

    def adapter_tensors(self, adapters=None, packed=False, dtype=None, shared=None):
        return {name: f"packed {name}" for name in adapters or ()}


def _rows(n=3):
    return DataProto.from_dict({"responses": torch.ones(n, 2, dtype=torch.long)}, {"agent_id": [0] * n})


@pytest.fixture
def train():
    worker = TrainWorker("train", spec=worker_spec(ModelConfig(), [AgentConfig(name="a0")]))
    worker.strategy = backend = RecordingBackend()
    cluster = LocalCluster(worker, TrainWorker, "train")
    yield TrainClient(cluster), backend, cluster
    worker.close()


def test_an_update_request_reaches_the_backend_as_sent_and_not_through_meta_info(train):
    client, backend, cluster = train
    rows = _rows()
    request = UpdateRequest(step=3, temperature=0.7, critic_only=True)
    result = client.train_step(rows, request)
    assert result == UpdateResult({"agent/a0/updated": 1.0}, (0,), ("a0",))  # rank 0's, not every rank's
    assert backend.calls == [("train_step", {"request": request})]
    assert cluster.calls[0][0] == "train_step" and rows.meta_info == {}


def test_score_requests_carry_the_temperature_and_the_reference_pass_turns_the_adapters_off(train):
    client, backend, _ = train
    client.compute_log_probs(_rows(), ScoreRequest(temperature=0.7))
    client.compute_ref_log_probs(_rows(), ScoreRequest(temperature=0.5))
    assert backend.calls == [
        ("compute_log_probs", {"adapters_enabled": True, "temperature": 0.7}),
        ("compute_log_probs", {"adapters_enabled": False, "temperature": 0.5}),
    ]


def test_train_and_export_updates_only_its_policy_and_keeps_the_rest_of_the_request(train):
    client, backend, _ = train
    request = UpdateRequest(step=5, behavior_correction=True)
    result, payload, seconds = client.train_and_export(_rows(), "alice", request, None, "shm")
    ((name, got),) = backend.calls
    assert name == "train_step" and got["request"] == UpdateRequest(step=5, behavior_correction=True,
                                                                     policies=("alice",))
    assert result.updated_adapters == ("alice",) and payload == {"alice": "packed alice"}
    assert isinstance(seconds, float)  # rank 0's export time, read as a number (its size is a benchmark's)


def test_a_dpo_pass_names_its_reference_and_a_dpo_update_cannot_lack_its_settings(train):
    client, backend, _ = train
    client.compute_pair_ref_log_probs(_rows(), "base")
    assert backend.calls == [("compute_pair_ref_log_probs", {"reference": "base"})]
    with pytest.raises(ValueError, match="dpo update needs its loss settings"):
        UpdateRequest(objective="dpo")
    client.train_step(_rows(), UpdateRequest(objective="dpo", dpo=DPOSettings(beta=0.5)))
    assert backend.calls[-1][1]["request"].dpo == DPOSettings(beta=0.5)


def test_the_reference_client_scores_at_the_requested_temperature():
    class Base(ReferenceWorker):
        def compute_ref_log_probs(self, data, request):  # the registered method's signature, a recorder
            self.asked = request
            return DataProto.from_dict({"ref_log_probs": torch.zeros(len(data), 2)})

    worker = Base("reference", spec=ReferenceWorkerSpec(ModelConfig(), MicroBatching(max_rows=4)))
    client = ReferenceClient(LocalCluster(worker, ReferenceWorker, "reference"))
    out = client.compute_ref_log_probs(_rows(2), ScoreRequest(temperature=0.3))
    assert worker.asked == ScoreRequest(temperature=0.3) and out.batch["ref_log_probs"].shape == (2, 2)


def test_env_workers_get_the_rollout_transport_not_its_client():
    seen = []

    class Env:
        def run_episodes(self, rollout, assignments, step, greedy=False, seats=None):
            seen.append((rollout, assignments, step, greedy, seats))
            return _rows(1)

    rollout_cluster = LocalCluster(None, RolloutWorker, "rollout")
    env = EnvClient(LocalCluster(Env(), EnvWorker, "env"))
    parts = env.run_episodes(RolloutClient(rollout_cluster), [["spec"]], step=4, greedy=True)
    assert len(parts) == 1 and seen == [(rollout_cluster, [["spec"]], 4, True, None)]
