"""rollout.sleep_level=kv_cache without a GPU: the engine's KV cache released and mapped again on its own.

vLLM's sleep-mode allocator exists on CUDA only, so these tests stand a fake allocator in for it (its
allocations and the two driver calls) and a fake engine for ``vllm.LLM``; what they pin is roll_ma's part:
only the KV cache's allocations are touched, a second release or restore changes nothing, the engine's
prefix cache is reset around it, and level 1 still goes through vLLM's own sleep. The real thing runs in
tests/inference/test_vllm_gpu.py (a ``gpu`` test: the same answers after each wake-up).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from roll_ma.config.schema import ModelConfig, RolloutConfig
from roll_ma.inference.rollout_common import check_sleep_level

pytest.importorskip("vllm")

from roll_ma.inference import vllm_worker_ext  # noqa: E402
from roll_ma.inference.vllm_infer import VLLMInferStrategy  # noqa: E402


@dataclass
class Allocation:  # vLLM's AllocationData: (device, size, pointer, handle), its tag, whether unmapped
    handle: tuple
    tag: str
    is_asleep: bool = False


@pytest.fixture
def allocator(monkeypatch):
    """Weights and KV cache allocations of a fake sleep-mode allocator; the driver calls it received."""
    import vllm.device_allocator.cumem as cumem

    held = {1: Allocation((0, 600, 1, 11), "weights"), 2: Allocation((0, 300, 2, 12), "kv_cache"),
            3: Allocation((0, 100, 3, 13), "kv_cache")}
    calls: list[tuple[str, int]] = []
    monkeypatch.setattr(cumem.CuMemAllocator, "get_instance",
                        staticmethod(lambda: type("Fake", (), {"pointer_to_data": held})()))
    monkeypatch.setattr(cumem, "unmap_and_release", lambda handle: calls.append(("unmap", handle[2])))
    monkeypatch.setattr(cumem, "create_and_map", lambda handle: calls.append(("map", handle[2])))
    monkeypatch.setattr("torch.cuda.synchronize", lambda: None)
    return held, calls


def test_the_kv_cache_alone_is_released_and_mapped_again_and_twice_changes_nothing(allocator):
    held, calls = allocator
    assert vllm_worker_ext.release_tagged("kv_cache") == 400
    assert calls == [("unmap", 2), ("unmap", 3)] and not held[1].is_asleep  # the weights stay mapped
    assert held[2].is_asleep and held[3].is_asleep
    with pytest.raises(RuntimeError, match="holds no 'kv_cache' memory to free"):
        vllm_worker_ext.release_tagged("kv_cache")  # already released: nothing is unmapped twice
    assert vllm_worker_ext.restore_tagged("kv_cache") == 400
    assert calls[2:] == [("map", 2), ("map", 3)] and not any(a.is_asleep for a in held.values())
    assert vllm_worker_ext.restore_tagged("kv_cache") == 0 and len(calls) == 4


class Engine:
    """vllm.LLM as far as sleeping goes: every call, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def reset_prefix_cache(self) -> bool:
        self.calls.append("reset_prefix_cache")
        return True

    def collective_rpc(self, method: str, args: tuple = ()) -> list:
        self.calls.append(method)
        return [0]

    def sleep(self, level: int = 1) -> None:
        self.calls.append(f"sleep({level})")

    def wake_up(self, tags=None) -> None:
        self.calls.append("wake_up")


def _strategy(level, device: str = "cuda", **rollout) -> tuple[VLLMInferStrategy, Engine]:
    strategy = VLLMInferStrategy(ModelConfig(path="unused", dtype="bfloat16"),
                                 RolloutConfig(sleep_level=level, **rollout), [], [], seed=0, device=device)
    strategy.llm = Engine()
    return strategy, strategy.llm


def test_a_kv_cache_sleep_goes_through_the_worker_extension_and_resets_the_prefix_cache():
    strategy, engine = _strategy("kv_cache")
    strategy.sleep("kv_cache")
    assert engine.calls == ["reset_prefix_cache", vllm_worker_ext.RELEASE_KV_METHOD]
    strategy.wake_up()
    assert engine.calls[2:] == [vllm_worker_ext.RESTORE_KV_METHOD, "reset_prefix_cache"]


def test_level_one_is_still_vllms_own_sleep_and_wake_up():
    strategy, engine = _strategy(1)
    strategy.sleep(1)
    strategy.wake_up()
    assert engine.calls == ["sleep(1)", "wake_up", "reset_prefix_cache"]


@pytest.mark.parametrize(("level", "error"), [(2, "level 2 drops the weights"), (0, "must be 1 or"),
                                              ("kv", "must be 1 or"), (True, "must be 1 or")])
def test_a_level_the_engine_cannot_sleep_at_is_refused(level, error):
    check_sleep_level(1)
    check_sleep_level("kv_cache")
    with pytest.raises(ValueError, match=error):
        check_sleep_level(level)


def test_the_kv_cache_sleep_starts_the_engine_with_roll_mas_worker_extension_and_refuses_another():
    ours = {"worker_extension_cls": vllm_worker_ext.EXTENSION_CLS}
    assert _strategy("kv_cache")[0]._worker_extension() == ours  # even a teacher (no adapters) needs it
    assert _strategy(1)[0]._worker_extension() == {}  # nothing to sync, vLLM's own sleep
    assert _strategy("kv_cache", device="cpu")[0]._worker_extension() == {}  # no sleep mode on CPU
    theirs = _strategy("kv_cache", engine_kwargs={"worker_extension_cls": "their.Extension"})[0]
    with pytest.raises(ValueError, match="names another \\('their.Extension'\\): set rollout.sleep_level=1"):
        theirs._worker_extension()

