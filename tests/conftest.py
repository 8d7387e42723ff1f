"""Shared fixtures: one local Ray per test session, tiny models built once in a tmp dir."""

import os
import sys
from pathlib import Path

import pytest

# Test folders mirror roll_ma's packages; what several folders share (helpers, toy envs, fixtures) lives in
# tests/helpers. Ray actors import test-module classes by name: every test folder goes on their PYTHONPATH.
_HELPERS = Path(__file__).parent / "helpers"
sys.path.insert(0, str(_HELPERS))
_TEST_DIRS = [str(p) for p in sorted({f.parent for f in _HELPERS.parent.rglob("test_*.py")} | {_HELPERS})]
os.environ["PYTHONPATH"] = os.pathsep.join(_TEST_DIRS + [p for p in [os.environ.get("PYTHONPATH")] if p])

# fixtures several test folders use: DataProto moves, train-side strategies, rollout engines
pytest_plugins = ["fixtures_protocol", "fixtures_training", "fixtures_inference"]

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
try:  # DeepSpeed must be told it has no GPU on CPU machines; on a GPU host leave it to auto-detect
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
except ImportError:
    pass
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray for the whole session (starting one costs ~7 s)."""
    from roll_ma.distributed.ray_env import init_ray, shutdown_ray

    init_ray()
    yield
    shutdown_ray()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A random tiny Qwen2 model + tokenizer saved like a hub model (no downloads)."""
    from roll_ma.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"), arch="qwen2", seed=0)


@pytest.fixture(autouse=True)
def refusals_in_user_words(request, monkeypatch):
    """In the validation and pre-flight suites, every refusal message names config keys, file:line and
    what the user wrote, never a word from inside the code (tests/helpers/message_words.py)."""
    from message_words import MESSAGE_SUITES, RefusalWords

    if request.module.__name__.rsplit(".", 1)[-1] not in MESSAGE_SUITES:
        yield None
        return
    words = RefusalWords()
    words.install(monkeypatch)
    yield words
    found = words.problems()
    if found:
        pytest.fail("refusal messages with words from inside the code:\n" + "\n".join(found), pytrace=False)


# what a Worker sets for its process (distributed.worker.Worker.__init__): right inside a Ray actor, a leak
# when a test builds a Worker in this process (a later trainer would take itself for another rank)
_WORKER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES")


@pytest.fixture(autouse=True)
def _worker_env_restored():
    before = {key: os.environ.get(key) for key in _WORKER_ENV}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
