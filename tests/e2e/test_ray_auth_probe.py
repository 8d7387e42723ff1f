"""The pre-flight auth probe against live clusters this test starts on this machine: one without auth
(Ray 2.60 lets a token-mode driver join it, then its actors die "cancelled before it started"), and the
token cluster of test_ray_token_auth.py (probed there)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pipeline_helpers import REPO
from ray_nodes import LocalCluster

pytestmark = pytest.mark.slow

PROBE = """
import sys
from roll_ma.config.schema import RunConfig
from roll_ma.preflight.ray_auth import ray_auth_problems

cfg = RunConfig()
cfg.resources.ray_address = sys.argv[1]
for p in ray_auth_problems(cfg):
    print("PROBLEM", p)
import ray
print("RAY STARTED", ray.is_initialized())
"""


def _probe(address: str, **env: str) -> str:
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_") and k != "RAY_ADDRESS"}
    run = subprocess.run([sys.executable, "-c", PROBE, address], cwd=REPO, env={**base, **env},
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert run.returncode == 0, run.stdout
    return run.stdout


def test_token_mode_against_a_cluster_without_auth_is_refused_before_joining(tmp_path):
    with LocalCluster() as cluster:
        cluster.add_node(cpus=1)
        out = _probe(cluster.address, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0123456789abcdef",
                     HOME=str(tmp_path))
        assert (f"PROBLEM RAY_AUTH_MODE: the Ray cluster at {cluster.address} runs without token "
                "authentication but RAY_AUTH_MODE=token is set") in out, out
        assert "Set RAY_AUTH_MODE=disabled for this run" in out and "RAY STARTED False" in out
        out = _probe(cluster.address, RAY_AUTH_MODE="disabled", HOME=str(tmp_path))
        assert "PROBLEM" not in out and "RAY STARTED False" in out, out
    out = _probe(cluster.address, HOME=str(tmp_path))  # stopped: nobody answers
    assert f"cannot reach the Ray cluster at {cluster.address}" in out, out
