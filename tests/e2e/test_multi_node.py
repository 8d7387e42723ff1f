"""Two Ray nodes on this machine, as a cluster of two hosts: rollout pinned to one, train to the other by
custom resources, placed through the run's placement group (declared GPUs, no CUDA), and a run that
completes there with the adapters crossing nodes through Ray's object store. It is also the test of a run
joining a cluster someone started (`ray start --head`, RAY_ADDRESS=host:port) unchanged: the progress bars
of work inside the actors are drawn on the driver."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from pipeline_helpers import REPO, steps_logged, toy_config, write_config
from ray_nodes import LocalCluster

from roll_ma.tracking import read_metrics

pytestmark = pytest.mark.slow
AGENTS = [{"name": "alice"}, {"name": "bob"}]
ROLLOUT_NODE, TRAIN_NODE = "roll_ma_test_rollout", "roll_ma_test_train"  # custom resources of the nodes


def test_rollout_and_train_on_different_nodes_sync_through_the_object_store(tiny_model_dir, tmp_path):
    with LocalCluster() as cluster:
        cluster.add_node(cpus=3, gpus=2, resources={ROLLOUT_NODE: 4})  # the head: the "inference" host
        cluster.add_node(cpus=3, gpus=1, resources={TRAIN_NODE: 4})  # a second node: the trainer
        cfg = toy_config(
            tmp_path, tiny_model_dir, AGENTS,
            trainer={"max_steps": 2, "save_every": 0, "progress_bars": True},
            rollout={"num_workers": 2},  # two engines: both must get every adapter, both are checked
            resources={
                "num_gpus": 3,
                "device_mapping": {"rollout": [0, 1], "train": [2]},
                "role_resources": {"rollout": {ROLLOUT_NODE: 1}, "train": {TRAIN_NODE: 1}},
            },
        )
        config_dir = write_config(tmp_path, cfg)
        run = subprocess.run(
            [sys.executable, str(REPO / "start_pipeline.py"), "--config_path", str(config_dir),
             "--config_name", "toy"],
            cwd=REPO, env={**cluster.env, "RAY_ADDRESS": cluster.address},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900,
        )
        assert run.returncode == 0, run.stdout[-6000:]
        (head,), (second,) = cluster.nodes_with(ROLLOUT_NODE), cluster.nodes_with(TRAIN_NODE)

    log = run.stdout
    assert f"joined the Ray cluster at {cluster.address}" in log and "3 GPUs, 2 node(s)" in log, log
    # where every worker landed, as the run reports it: node id prefix -> the workers on it
    line = next((x for x in log.splitlines() if x.startswith("[roll_ma] placement over 2 nodes: ")), None)
    assert line is not None, log
    placed = {node: names for node, names in re.findall(r"node (\w{8}) \([^)]*\): ([^;]+)", line)}
    assert "rollout 0" in placed[head[:8]] and "rollout 1" in placed[head[:8]], line
    assert "train 0" in placed[second[:8]] and "rollout" not in placed[second[:8]], line
    # the hand-over the sync chose: not shared-memory files (another node cannot read them)
    assert "[roll_ma] adapter sync through Ray's object store (rollout workers on 1 node(s)" in log, log
    assert steps_logged(tmp_path / "out") == [1, 2]
    # progress bars drawn on the driver for work inside the actors, on either node (trainer.progress_bars)
    assert "rollout step 1, env worker 0" in log and "update alice, step 1" in log, log
    for m in read_metrics(tmp_path / "out" / "metrics.jsonl"):
        assert m["system/sync_object_store"] == 1.0 and m["rollout/adapters_synced"] > 0
        assert m.get("rollout/stale_rows", 0) == 0  # both engines served the newest adapters
