"""Fixtures of the core tests: ``moved`` sends a DataProto the ways a worker can receive it; ``no_ray``
fails a test that starts Ray (pre-flight checks must refuse a run before)."""

import pickle

import pytest


@pytest.fixture(params=["local", "pickle", "ray"])
def moved(request):
    """A function that returns its DataProto as is, through pickle, or through Ray's object store."""
    if request.param == "local":
        return lambda data: data
    if request.param == "pickle":
        return lambda data: pickle.loads(pickle.dumps(data))
    request.getfixturevalue("ray_session")
    import ray

    return lambda data: ray.get(ray.put(data))


@pytest.fixture
def no_ray(monkeypatch):
    """Starting Ray fails the test: every check must stop the run before."""
    import ray

    from roll_ma.distributed import ray_env

    def started(*args, **kwargs):
        raise AssertionError("Ray was started before the pre-flight check refused the run")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(ray_env, "init_ray", started)
    monkeypatch.setattr(ray, "init", started)
    was = ray.is_initialized()
    yield
    assert ray.is_initialized() == was
