"""No silent hangs: stuck calls, actors that never start, and an error on one rank while another blocks.

The watchdog's decisions are tested on a fake clock (no waiting); the Ray tests use workers that
block on an event that never comes, with timeouts of a second or two.
"""

from __future__ import annotations

import threading

import pytest

from roll_ma.distributed import activity, watchdog
from roll_ma.distributed.activity import Report
from roll_ma.distributed.cluster import Cluster, WorkerError, WorkerStalled, WorkerStartError
from roll_ma.distributed.resources import ResourceManager
from roll_ma.distributed.worker import Dispatch, Worker, register


def _report(seq: int, what: str = "working", at: float = 0.0) -> Report:
    return Report(what, at, seq, 4242, "10.0.0.7", "/tmp/ray/session_x/logs/worker-*-4242.{out,err}")


# ---------------------------------------------------------------- decisions, on a fake clock
class FakeRay:
    """ray.wait / ray.get / the report store / the clock of one call, scripted poll by poll."""

    def __init__(self, monkeypatch, polls: list[dict], ready_after: int | None):
        import ray

        self.polls, self.ready_after, self.now, self.n = polls, ready_after, 1000.0, 0
        self.notes: list[str] = []
        monkeypatch.setattr(ray, "wait", self.wait)
        monkeypatch.setattr(ray, "get", lambda ref: f"result of {ref}")
        monkeypatch.setattr(activity, "read", lambda keys: {k: self.polls[self.n - 1].get(k) for k in keys})
        monkeypatch.setattr(activity, "note", lambda what, force=True: self.notes.append(what))

    def monotonic(self) -> float:  # the clock wait_for_call reads: a poll moves it by its timeout
        return self.now

    time = monotonic

    def wait(self, refs, num_returns=1, timeout=None):
        if timeout == 0:  # the sweep after an answer
            return list(refs), []
        if timeout is None:  # a blocking wait: it returns when an answer is in, however long that takes
            self.now += 10_000.0
            return list(refs), []
        self.n += 1
        self.now += timeout  # a poll that found nothing took its whole timeout
        if self.ready_after is not None and self.n > self.ready_after:
            return list(refs), []
        return [], list(refs)


def _call(fake: FakeRay, stall: float = 2.5, deadline: float | None = None, starting: bool = False):
    # stall 2.5 s: polls every 0.25 s, exact in binary, so the fake clock adds up without rounding
    return watchdog.wait_for_call("train", "train_step", [0, 1], ["r0", "r1"], ["k0", "k1"], list,
                                  stall_timeout_s=stall, deadline_s=deadline, starting=starting, clock=fake)


def test_a_long_call_that_keeps_reporting_is_never_stopped(monkeypatch):
    # 40 polls of 0.25 s (10 s, four times the stall timeout), a new report at every poll
    polls = [{"k0": _report(i), "k1": _report(i)} for i in range(40)]
    fake = FakeRay(monkeypatch, polls, ready_after=40)
    assert _call(fake) == ["result of r0", "result of r1"]
    assert fake.notes, "progress seen while waiting is passed on as this process's own report"


def test_a_call_without_a_sign_of_life_stops_naming_rank_method_last_report_and_logs(monkeypatch):
    polls = [{"k0": _report(5, at=990.0), "k1": _report(7, "update alice, step 3: 2/4 batch", at=995.5)}] * 50
    fake = FakeRay(monkeypatch, polls, ready_after=None)
    with pytest.raises(WorkerStalled) as err:
        _call(fake)
    text = str(err.value)
    assert err.value.role == "train" and err.value.rank == 0 and err.value.method == "train_step"
    assert text.startswith("train worker rank 0 made no progress for 2.5 s in train_step() "
                           "(trainer.stall_timeout_s=2.5)")
    assert 'rank 1: last report 7 s ago: "update alice, step 3: 2/4 batch" (pid 4242 on 10.0.0.7)' in text
    assert "logs: /tmp/ray/session_x/logs/worker-*-4242.{out,err} on 10.0.0.7" in text
    # the rank silent the longest comes first: the others may only be waiting on it
    assert text.index("rank 0: last report") < text.index("rank 1: last report")


def test_progress_then_silence_counts_from_the_last_sign_of_life(monkeypatch):
    # reports move for 10 polls, then stop: the stall is declared 2.5 s after the last move
    polls = [{"k0": _report(min(i, 10)), "k1": None} for i in range(60)]
    fake = FakeRay(monkeypatch, polls, ready_after=None)
    with pytest.raises(WorkerStalled):
        _call(fake)
    assert fake.n == 21  # the last change is seen at poll 11, then 10 polls x 0.25 s of silence


def test_stall_timeout_zero_waits_forever(monkeypatch):
    fake = FakeRay(monkeypatch, [], ready_after=None)
    assert watchdog.poll_interval(0.0, None) is None  # ray.wait blocks: nothing to look at meanwhile
    assert _call(fake, stall=0.0, deadline=None) == ["result of r0", "result of r1"]
    assert fake.now == 11_000.0  # answered after 10,000 silent seconds: no error


def test_actors_that_do_not_start_in_time_are_named_with_what_they_did(monkeypatch):
    polls = [{"k0": None, "k1": _report(1, "TrainWorker.__init__() started", at=1000.0)}] * 20
    fake = FakeRay(monkeypatch, polls, ready_after=None)
    with pytest.raises(WorkerStartError) as err:
        _call(fake, stall=0.0, deadline=2.0, starting=True)
    text = str(err.value)
    assert text.startswith("train worker rank 0 did not start within 2 s (resources.actor_start_timeout_s)")
    assert "rank 0: it never reported: Ray did not start its process, or the process could not" in text
    assert 'rank 1: last report 2 s ago: "TrainWorker.__init__() started"' in text
    assert "token authentication" in text and "raylet.out" in text


def test_registered_methods_report_start_return_and_raise(monkeypatch):
    seen: list[str] = []
    reporter = type("Recorder", (), {"note": lambda self, what, force=True: seen.append(what)})()
    monkeypatch.setattr(activity, "_reporter", reporter)
    w = StuckWorker(role="stuck", rank=1, world_size=2)
    assert w.quick() == 1
    with pytest.raises(ValueError):
        w.fail_on_rank_one()
    assert seen == ["quick() started", "quick() returned", "fail_on_rank_one() started",
                    "fail_on_rank_one() raised ValueError: rank 1 fails on purpose"]


# ---------------------------------------------------------------- the same on Ray
class StuckWorker(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def quick(self) -> int:
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def stuck_on_rank_one(self) -> int:
        if self.rank == 1:
            activity.note("waiting for an event that never comes")
            threading.Event().wait()  # blocks for good: only the watchdog ends this call
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def fail_on_rank_one(self) -> int:
        if self.rank == 1:
            raise ValueError("rank 1 fails on purpose")
        if self.world_size > 1:
            threading.Event().wait()  # rank 0 blocks, as a rank does in a collective whose peer died
        return self.rank


class Unplaceable(ResourceManager):
    """Asks Ray for a resource no node has: the actors stay pending, as on a cluster that is full."""

    def actor_options(self, role: str, rank: int) -> dict:
        return {**super().actor_options(role, rank), "resources": {"no_such_node_resource": 1}}


@pytest.mark.timeout(300)
def test_a_stuck_rank_stops_the_call_with_its_last_report_and_logs(ray_session):
    cluster = Cluster("stuck", StuckWorker, 2, stall_timeout_s=1.0)
    try:
        assert cluster.quick() == [0, 1]
        with pytest.raises(WorkerStalled) as err:
            cluster.stuck_on_rank_one()
        text = str(err.value)
        assert "stuck worker rank 1 made no progress for" in text and "stuck_on_rank_one()" in text
        assert '"waiting for an event that never comes"' in text
        assert "logs: " in text and "/logs/worker-*-" in text and ".{out,err} on " in text
        assert "trainer.stall_timeout_s=1" in text
    finally:
        cluster.shutdown()


@pytest.mark.timeout(300)
def test_an_error_on_one_rank_surfaces_while_another_rank_blocks(ray_session):
    # rank 0 blocks for good and no stall timeout is set: before, the driver waited on rank 0 first,
    # forever, and never saw rank 1's error
    cluster = Cluster("pair", StuckWorker, 2)
    try:
        with pytest.raises(WorkerError, match="pair worker rank 1 failed in fail_on_rank_one"):
            cluster.fail_on_rank_one()
    finally:
        cluster.shutdown()


@pytest.mark.timeout(300)
def test_actors_that_cannot_start_stop_with_an_error_and_are_removed(ray_session):
    import ray

    with pytest.raises(WorkerStartError) as err:
        Cluster("train", StuckWorker, 2, resources=Unplaceable.cpu_only(), start_timeout_s=2.0)
    text = str(err.value)
    assert text.startswith("train worker rank 0 did not start within 2 s (resources.actor_start_timeout_s)")
    assert "rank 0: it never reported" in text and "raylet.out" in text
    # the pending actors were killed, not left queued in Ray
    assert not [a for a in ray.util.list_named_actors() if a.startswith("train_")]
