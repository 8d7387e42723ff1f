"""Ray token authentication: roll_ma's own local Ray runs without it, a joined cluster keeps the user's.

These tests stand in for ``ray.init`` (no Ray starts); the token-auth cluster itself is in
tests/e2e/test_ray_token_auth.py.
"""

from __future__ import annotations

import pytest

from roll_ma.config.schema import RunConfig
from roll_ma.distributed import ray_env
from roll_ma.errors import RunStartError

AUTH = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


@pytest.fixture
def fake_init(monkeypatch):
    """Record what init_ray passes to ray.init and the auth variables the driver has at that moment."""
    import ray

    calls: list[dict] = []

    def init(**kwargs):
        import os

        calls.append({"kwargs": kwargs, "env": {k: os.environ.get(k) for k in AUTH}})

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(ray, "nodes", lambda: [{}])
    for var in (*AUTH, "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    return calls


def test_joining_a_cluster_keeps_the_users_auth_mode_and_token_for_driver_and_actors(fake_init, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", "/secrets/ray_token")
    ray_env.init_ray("10.0.0.1:6379")
    (call,) = fake_init
    assert call["kwargs"]["address"] == "10.0.0.1:6379"
    assert call["env"] == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": None,
                           "RAY_AUTH_TOKEN_PATH": "/secrets/ray_token"}
    # actors inherit the auth mode and token of the node that starts them: nothing may override them
    actor_env = call["kwargs"]["runtime_env"]["env_vars"]
    assert not any(k.startswith("RAY_AUTH") for k in actor_env), actor_env


def test_joining_with_no_mode_set_leaves_the_choice_to_ray(fake_init, monkeypatch):
    # RAY_ADDRESS=auto and a token in ~/.ray: Ray itself turns token mode on; roll_ma must not disable it
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    ray_env.init_ray()
    (call,) = fake_init
    assert call["kwargs"]["address"] == "auto"
    assert call["env"]["RAY_AUTH_MODE"] is None
    assert "RAY_AUTH_MODE" not in call["kwargs"]["runtime_env"]["env_vars"]


def test_the_local_ray_roll_ma_starts_runs_without_token_auth_as_before(fake_init):
    ray_env.init_ray()
    (call,) = fake_init
    assert call["kwargs"]["address"] == "local"
    assert call["env"]["RAY_AUTH_MODE"] == "disabled"  # no token file written to ~/.ray, no auth notice


def test_a_failed_join_says_how_to_pass_the_clusters_token(fake_init, monkeypatch):
    import ray

    def refuse(**kwargs):
        raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")

    monkeypatch.setattr(ray, "init", refuse)
    with pytest.raises(RunStartError) as err:
        ray_env.init_ray("10.0.0.1:6379")
    text = str(err.value)
    assert text.startswith("could not join the Ray cluster at 10.0.0.1:6379: Failed to connect")
    assert "set RAY_AUTH_MODE=token" in text and "RAY_AUTH_TOKEN" in text and "ray get-auth-token" in text
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    with pytest.raises(RunStartError, match="RAY_AUTH_MODE=token is set: check that the token this process"):
        ray_env.init_ray("10.0.0.1:6379")


def test_ray_auth_variables_are_checked_before_the_run(monkeypatch, tmp_path):
    from roll_ma.preflight.ray_auth import ray_auth_problems

    for var in (*AUTH, "RAY_ADDRESS"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token
    cfg = RunConfig()
    assert ray_auth_problems(cfg) == []
    monkeypatch.setenv("RAY_AUTH_MODE", "tokn")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "missing"))
    assert set(ray_auth_problems(cfg)) == {
        "RAY_AUTH_MODE: the environment variable is 'tokn'; Ray knows 'token' and 'disabled' "
        "(or leave it unset)",
        f"RAY_AUTH_TOKEN_PATH: {tmp_path / 'missing'} is not a file; point it at the cluster's token file "
        "or unset it",
    }
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH")
    cfg.resources.ray_address = "10.0.0.1:6379"
    (problem,) = ray_auth_problems(cfg)
    assert "no token to join the cluster with" in problem and "~/.ray/auth_token" in problem
