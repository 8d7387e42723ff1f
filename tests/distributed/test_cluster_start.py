"""Clusters asked for with ``wait=False`` start their actors at once: a run's roles import torch and their
backends side by side instead of one after another (``pipelines.clusters.build_workers``).

The proof needs no clock: two roles whose constructors each wait for the other's to have begun can
only both start when neither cluster waits for its own actors before the other is asked for; and a run's
``build_workers`` asks for every role before it waits for any."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from roll_ma.distributed.cluster import Cluster, WorkerError
from roll_ma.distributed.worker import Dispatch, Worker, register


class MeetingWorker(Worker):
    """Marks ``mine`` as begun, then waits (up to ``patience_s``) for ``theirs``: another role's
    constructor, which must be running at the same time."""

    def __init__(self, mine: str, theirs: str, patience_s: float = 60.0, **kwargs):
        super().__init__(**kwargs)
        Path(mine).touch()
        deadline = time.monotonic() + patience_s
        while not Path(theirs).exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{theirs} never began: the other cluster was not started beside this one")
            time.sleep(0.05)  # polling a file another process writes; the test asserts no timing

    @register(Dispatch.ONE_TO_ALL)
    def role_and_master(self) -> tuple[str, str]:
        return self.role, os.environ.get("MASTER_PORT", "")


class BrokenWorker(Worker):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        raise ValueError("broken on purpose")


@pytest.mark.timeout(300)
def test_clusters_asked_for_without_waiting_start_side_by_side(ray_session, tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    first = Cluster("first", MeetingWorker, 1, init_kwargs={"mine": a, "theirs": b}, wait=False)
    second = Cluster("second", MeetingWorker, 1, init_kwargs={"mine": b, "theirs": a}, wait=False)
    try:
        first.wait_started()
        second.wait_started()
        second.wait_started()  # a second call is a no-op
        # each started and got its role's rendezvous (what wait_started does after the first call)
        (role_a, port_a), (role_b, port_b) = first.role_and_master()[0], second.role_and_master()[0]
        assert (role_a, role_b) == ("first", "second") and port_a and port_b
    finally:
        first.shutdown()
        second.shutdown()


@pytest.mark.timeout(300)
def test_waiting_in_the_constructor_starts_one_cluster_at_a_time(ray_session, tmp_path):
    # the same pair with the default wait=True: the first cluster's actor waits for a second that is
    # not asked for until the first has started, so its constructor gives up and says why
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    with pytest.raises(WorkerError, match="never began"):
        Cluster("first", MeetingWorker, 1, init_kwargs={"mine": a, "theirs": b, "patience_s": 2.0})


@pytest.mark.timeout(300)
def test_a_cluster_that_fails_to_start_is_killed_when_waited_for(ray_session):
    import ray

    broken = Cluster("broken", BrokenWorker, 2, wait=False)
    with pytest.raises(WorkerError, match="broken on purpose"):
        broken.wait_started()
    assert broken.workers == []
    assert not [a for a in ray.util.list_named_actors() if a.startswith("broken_")]


def test_a_run_asks_for_every_role_before_waiting_for_any(monkeypatch, tmp_path):
    # build_workers with a recording Cluster: every role's actors are asked for (wait=False) before the run
    # waits for the first of them, then it waits for each role once
    from roll_ma.config.run_plan import run_plan
    from roll_ma.pipelines import clusters
    from roll_ma.preflight.config_loader import load_config

    events: list[tuple[str, str]] = []

    class Recording:
        def __init__(self, role: str, worker_cls: type, num_workers: int, resources=None,  # noqa: ANN001
                     *, wait: bool = True, **kwargs):  # noqa: ANN003
            assert not wait, f"{role}: asked for with wait=True, which starts the roles one after another"
            self.role, self.world_size, self.workers = role, num_workers, []
            events.append(("ask", role))

        def wait_started(self) -> None:
            events.append(("wait", self.role))

    monkeypatch.setattr(clusters, "Cluster", Recording)
    monkeypatch.setattr(clusters, "placement_report", lambda workers: None)  # it would ask the actors' nodes
    cfg = load_config("math_selfplay_tiny", None, [f"trainer.output_dir={tmp_path}"])
    clusters.build_workers(cfg, run_plan(cfg), ["solver", "critic", "refiner"])
    asks = [role for what, role in events if what == "ask"]
    assert events == [("ask", role) for role in asks] + [("wait", role) for role in asks]
    assert {"train", "rollout", "env"} <= set(asks)
