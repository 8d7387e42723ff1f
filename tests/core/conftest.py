"""Fixtures of the core tests: ``moved`` sends a DataProto the ways a worker can receive it."""

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
