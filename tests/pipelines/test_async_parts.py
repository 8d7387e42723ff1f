"""The asynchronous loop's parts without Ray: which rows are too old to train on, the order in which
the streaming sync updates and installs adapters, and what a checkpoint stores of the planner."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from local_cluster import LocalCluster

from roll_ma.algorithms.staleness import drop_stale_rows
from roll_ma.config.schema import RunConfig
from roll_ma.pipelines.rl.adapter_sync import AdapterSync
from roll_ma.pipelines.rl.rollout_queue import RolloutQueue
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import UpdateRequest, UpdateResult
from roll_ma.workers.clients import EnvClient, RolloutClient, TrainClient
from roll_ma.workers.env_worker import EnvWorker
from roll_ma.workers.rollout_worker import RolloutWorker
from roll_ma.workers.train_worker import TrainWorker


def _rows(agent_ids, versions, episodes):
    n = len(agent_ids)
    return DataProto.from_dict(
        {"response_mask": torch.ones(n, 2)},
        {"agent_id": list(agent_ids), "adapter_version": list(versions), "episode_id": list(episodes)},
    )


def test_rows_more_than_k_versions_old_are_never_trained_on():
    # alice's adapter is at version 5, bob's (updated every other step) at 4
    batch = _rows([0, 0, 1, 1, 0], [5, 3, 4, 2, 4], ["e1", "e1", "e1", "e2", "e2"])
    names, now = ["alice", "bob"], {"alice": 5, "bob": 4}
    kept, metrics = drop_stale_rows(batch, names, names, now, limit=1)
    # staleness: [0, 2, 0, 2, 1] -> rows 1 and 3 go
    assert kept.non_tensor["adapter_version"].tolist() == [5, 4, 4]
    assert metrics["rollout/dropped_stale_rows"] == 2.0
    assert metrics["agent/alice/staleness_max"] == 2.0 and metrics["agent/alice/staleness_mean"] == 1.0
    assert metrics["agent/bob/staleness_max"] == 2.0
    assert metrics["rollout/mixed_version_episodes"] == 1.0  # e1: {5, 3, 4}; e2: {2, 4}
    same, m0 = drop_stale_rows(batch, names, names, now, limit=2)
    assert len(same) == 5 and m0["rollout/dropped_stale_rows"] == 0.0
    with pytest.raises(RuntimeError, match="newer than the trainer"):
        drop_stale_rows(batch, names, names, {"alice": 4, "bob": 4}, limit=1)


class _Events:
    """Fake train and rollout workers behind the real clients (a ``LocalCluster`` each): they record what
    happens, in order, and the requests the train worker gets."""

    def __init__(self):
        self.log: list[tuple[str, str]] = []
        self.requests: list[UpdateRequest] = []
        outer = self

        class Train:
            def train_and_export(self, data, policy, request, dtype=None, transport="ray"):
                outer.requests.append(request)
                outer.log.append(("update_start", policy))
                outer.log.append(("update_end", policy))
                took = UpdateResult({f"agent/{policy}/updated": 1.0}, (), (policy,))
                return [took, {policy: f"packed {policy}"}, 0.001]

            def node_id(self):
                return "n0"

            def release_exports(self, segments=None):
                return 0

        class Rollout:
            def __init__(self):
                self.versions = {}

            def update_adapters(self, tensors, version):
                for name in tensors:  # an idle engine installs at once
                    outer.log.append(("installed", name))
                    self.versions[name] = version
                return {name: 0.01 for name in tensors}

            def adapter_versions(self):
                return dict(self.versions)

            def node_id(self):
                return "n1"

        self.train = TrainClient(LocalCluster(Train(), TrainWorker, "train"))
        self.rollout = RolloutClient(LocalCluster(Rollout(), RolloutWorker, "rollout"))


def test_streamed_adapter_of_an_agent_reaches_the_engine_before_the_next_agents_update_ends(monkeypatch):
    import ray

    monkeypatch.setattr(ray, "put", lambda x: x)
    events = _Events()
    sync = AdapterSync(RunConfig(), events.train, events.rollout)
    assert sync.transport == "ray"  # the engines run on another node than train rank 0
    request = UpdateRequest(step=7, behavior_correction=True)
    metrics, pushed = sync.stream(_rows([0], [6], ["e1"]), request, ["alice", "bob", "carol"], version=7)
    log = events.log
    assert pushed == ["alice", "bob", "carol"] and metrics["rollout/adapters_synced"] == 3.0
    assert events.requests == [request] * 3  # each policy's call carries the step's request
    assert log.index(("installed", "alice")) < log.index(("update_end", "bob"))
    assert log.index(("installed", "bob")) < log.index(("update_end", "carol"))
    assert log.index(("update_end", "alice")) < log.index(("installed", "alice"))  # never before its update


class _Planner:
    def __init__(self):
        self.cursor = 0

    def train_assignments(self, step, n):
        self.cursor += 1
        return [[f"episodes of step {step}"]]

    def state_dict(self):
        return {"cursor": self.cursor}


def test_a_checkpoint_stores_the_planner_from_before_the_rollout_in_flight():
    class Env:
        def run_episodes(self, rollout, assignments, step, greedy=False, seats=None):
            return f"rows of {assignments[0][0]}"

    rollout = RolloutClient(LocalCluster(None, RolloutWorker, "rollout"))
    workers = type("W", (), {"env": EnvClient(LocalCluster(Env(), EnvWorker, "env")), "rollout": rollout})()
    planner = _Planner()
    queue = RolloutQueue(workers, planner, ahead=True)
    assert queue.take(1) == ["rows of episodes of step 1"] and planner.cursor == 1
    queue.launch(2)  # drawn now, trained on at step 2: a checkpoint of step 1 must not skip it
    assert planner.cursor == 2 and queue.planner_state() == {"cursor": 1}
    assert queue.take(2) == ["rows of episodes of step 2"]
    assert queue.planner_state() == {"cursor": 2}
    with pytest.raises(RuntimeError, match="in flight is step 3's, step 4's was asked for"):
        queue.launch(3)
        queue.take(4)
    sync_queue = RolloutQueue(workers, _Planner(), ahead=False)
    sync_queue.launch(9)  # ignored without ahead
    assert sync_queue.take(1) == ["rows of episodes of step 1"]


def test_async_config_checks():
    from roll_ma.config import ConfigError
    from roll_ma.preflight.config_loader import load_config

    with pytest.raises(ConfigError) as err:
        load_config("math_selfplay_7b", overrides=["rollout.max_staleness=1"], check_local_gpus=False)
    assert "sleeps while it trains" in str(err.value)
    cfg = load_config("math_selfplay_7b", overrides=["rollout.max_staleness=1", "rollout.sleep_level=0"],
                      check_local_gpus=False)
    assert cfg.rollout.max_staleness == 1
    with pytest.raises(ConfigError) as err:
        load_config("tiny_hanabi_selfplay", overrides=["rollout.max_staleness=1"])
    assert "joint policy search" in str(err.value)
    np.testing.assert_equal(load_config("math_selfplay_tiny").rollout.max_staleness, 0)


def test_cpu_actors_start_with_passive_openmp_waits_and_threads_split_by_the_workers_computing_at_once(
    monkeypatch,
):
    from roll_ma.config.run_plan import run_plan
    from roll_ma.pipelines.clusters import cpu_sharers, process_env
    from roll_ma.preflight.config_loader import load_config

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    sync = load_config("math_selfplay_tiny", overrides=["train.num_workers=2"])
    async_cpu = load_config("math_selfplay_tiny", overrides=["rollout.max_staleness=1"])
    gpu_overrides = ["rollout.max_staleness=1", "rollout.sleep_level=0"]
    async_gpu = load_config("math_selfplay_7b", overrides=gpu_overrides, check_local_gpus=False)
    assert process_env(async_cpu) == process_env(sync) == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert process_env(async_gpu) == {}
    # sync: the train ranks compute together, the rollout in turn; async: both at once
    sync_plan, async_plan = run_plan(sync), run_plan(async_cpu)
    assert (cpu_sharers(sync, sync_plan, "train"), cpu_sharers(sync, sync_plan, "rollout")) == (2, 1)
    assert cpu_sharers(async_cpu, async_plan, "train") == cpu_sharers(async_cpu, async_plan, "rollout") == 2
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the user's own setting wins
    assert process_env(async_cpu) == {}


def test_a_cpu_worker_takes_its_share_of_the_cores_this_process_may_use(monkeypatch):
    import torch

    from roll_ma.training import ds_utils

    before = torch.get_num_threads()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
    monkeypatch.setenv(ds_utils.SHARERS_VAR, "3")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # what Ray sets in an actor of 0.1 CPU
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    try:
        assert ds_utils.use_cpu_threads(world_size=1) == 2 and torch.get_num_threads() == 2
        assert os.environ["OMP_NUM_THREADS"] == os.environ["MKL_NUM_THREADS"] == "2"
        monkeypatch.delenv(ds_utils.SHARERS_VAR)  # a worker built outside the pipeline: its role's ranks
        assert ds_utils.use_cpu_threads(world_size=6) == 1
    finally:
        torch.set_num_threads(before)


def test_a_reference_worker_starts_only_where_a_loss_reads_its_log_probs():
    from roll_ma.config.run_plan import run_plan
    from roll_ma.config.schema import RunConfig
    from roll_ma.pipelines.clusters import cpu_sharers

    cfg = RunConfig()
    cfg.reference.mode, cfg.reference.num_workers = "worker", 2
    cfg.algorithm.kl_coef = 0.01
    assert run_plan(cfg).reference_workers == 2 and cpu_sharers(cfg, run_plan(cfg), "reference") == 2
    cfg.algorithm.kl_coef = 0.0  # no KL term: nothing reads reference log-probs, no actor holds a model
    assert run_plan(cfg).reference_workers == 0 and cpu_sharers(cfg, run_plan(cfg), "reference") == 1
    cfg.reference.mode, cfg.algorithm.kl_coef = "train_worker", 0.01  # the train workers give them
    assert run_plan(cfg).reference_workers == 0
