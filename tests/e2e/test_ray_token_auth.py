"""A Ray cluster with token authentication, as Ray 2.60's `ray start --head` makes one when ~/.ray/auth_token
exists: roll_ma joins it with the user's auth settings and its actors register and run.

The cluster's ~/.ray lives in a temp HOME (the real one is never touched) and the cluster is
stopped by a signal to its own `ray start` process (never `ray stop`, which would stop every Ray on the
machine).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from types import SimpleNamespace

import pytest
from pipeline_helpers import REPO, steps_logged, toy_config, write_config
from ray_nodes import free_port, start_node, stop_nodes

pytestmark = pytest.mark.slow
AGENTS = [{"name": "alice"}, {"name": "bob"}]


def _env(**extra: str) -> dict[str, str]:
    """This process's environment without any Ray auth or address setting (conftest disables auth)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_") and k != "RAY_ADDRESS"}
    return {**env, **extra}


@pytest.fixture(scope="module")
def token_cluster(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    (home / ".ray").mkdir()
    token = uuid.uuid4().hex
    (home / ".ray" / "auth_token").write_text(token)
    temp_dir = tempfile.mkdtemp(prefix="raytok", dir="/tmp")  # short: Ray's socket paths must fit
    # RAY_TMPDIR (not --temp-dir): the head writes its address to $RAY_TMPDIR/ray/ray_current_cluster,
    # where a driver with RAY_ADDRESS=auto and the same RAY_TMPDIR looks; without that file, `auto`
    # joins any Ray running on this machine
    env = _env(HOME=str(home), RAY_TMPDIR=temp_dir)
    port, head = free_port(), None
    try:
        head, said = start_node(["--head", f"--port={port}", "--num-cpus=3", "--include-dashboard=false",
                                 "--disable-usage-stats"], env)
        # what users meet: a token in ~/.ray turns token auth on, no RAY_AUTH_MODE needed
        assert "Token authentication is enabled for this Ray cluster" in said, said
        yield SimpleNamespace(address=f"127.0.0.1:{port}", env=env, token=token, temp_dir=temp_dir)
    finally:
        if head is not None:
            stop_nodes([head])
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_two_steps_on_a_token_auth_cluster_joined_with_ray_address_auto(token_cluster, tiny_model_dir,
                                                                        tmp_path):
    cfg = toy_config(tmp_path, tiny_model_dir, AGENTS, trainer={"max_steps": 2})
    run = subprocess.run(
        [sys.executable, str(REPO / "start_pipeline.py"), "--config_path", str(write_config(tmp_path, cfg)),
         "--config_name", "toy", "trainer.progress_bars=false"],
        cwd=REPO, env={**token_cluster.env, "RAY_ADDRESS": "auto"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600,
    )
    assert run.returncode == 0, run.stdout
    # 3 CPUs: this cluster, not another Ray that happens to run on the machine
    assert "joined the Ray cluster at auto (auth mode token): 3 CPUs" in run.stdout, run.stdout
    assert steps_logged(tmp_path / "out") == [1, 2]


AUTH_PROBE = """
import os, sys
from roll_ma.distributed.cluster import Cluster
from roll_ma.distributed.ray_env import init_ray
from roll_ma.distributed.worker import Dispatch, Worker, register

class Probe(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def auth(self):
        return os.environ.get("RAY_AUTH_MODE")

init_ray(sys.argv[1])
cluster = Cluster("probe", Probe, 2)
print("ACTORS", cluster.auth())
cluster.shutdown()
"""


def test_driver_and_actors_use_the_users_token_mode_on_an_explicit_address(token_cluster, tmp_path):
    # the token in a file of its own (RAY_AUTH_TOKEN_PATH), no ~/.ray/auth_token in this HOME
    token_file = tmp_path / "cluster_token"
    token_file.write_text(token_cluster.token)
    env = _env(HOME=str(tmp_path), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token_file))
    run = subprocess.run(
        [sys.executable, "-c", AUTH_PROBE, token_cluster.address], cwd=REPO, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240,
    )
    assert run.returncode == 0, run.stdout
    joined = f"joined the Ray cluster at {token_cluster.address} (auth mode token): 3 CPUs"
    assert joined in run.stdout, run.stdout
    # actors registered with the cluster's own mode: before, roll_ma forced them to 'disabled' and they died
    assert "ACTORS ['token', 'token']" in run.stdout, run.stdout


def test_the_preflight_probe_reads_the_clusters_auth_mode_and_checks_the_token(token_cluster):
    from roll_ma.preflight.ray_auth import ClusterAuth, probe_cluster

    address = token_cluster.address
    assert probe_cluster(address, None) == ClusterAuth(True, wants_token=True)
    accepted = ClusterAuth(True, wants_token=True, accepts_our_token=True)
    assert probe_cluster(address, token_cluster.token) == accepted
    assert probe_cluster(address, "not-the-token").accepts_our_token is False
