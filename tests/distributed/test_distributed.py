"""A 2-rank cluster on CPU Ray: dispatch modes, rank env, non-blocking calls, actor errors, GPU bundles."""

import os
import subprocess
import sys

import pytest
import torch

from roll_ma.distributed.cluster import Cluster, PendingCall, WorkerError
from roll_ma.distributed.resources import ResourceManager, default_device_mapping, gpu_shares
from roll_ma.distributed.worker import Dispatch, Worker, register
from roll_ma.protocol import DataProto


class EchoWorker(Worker):
    def __init__(self, scale: float = 1.0, **kwargs):
        super().__init__(**kwargs)
        self.scale = scale
        self.calls = 0

    @register(Dispatch.DP_COMPUTE)
    def scaled(self, data: DataProto) -> DataProto:
        self.calls += 1
        out = DataProto.from_dict({"y": data.batch["x"] * self.scale}, {"served_by": [self.rank] * len(data)})
        return data.union(out)

    @register(Dispatch.DP_BALANCED)
    def scaled_balanced(self, data: DataProto) -> DataProto:
        return self.scaled(data)

    @register(Dispatch.DP_COMPUTE)
    def report(self, data: DataProto) -> DataProto:
        """Echoes the request's meta_info (as workers do) and adds metrics of this rank."""
        metrics = {"rows": len(data), "rank": self.rank, "scale": self.scale}
        return DataProto.from_dict({"y": data.batch["x"]}, meta_info={**data.meta_info, "metrics": metrics})

    @register(Dispatch.ONE_TO_ALL)
    def env(self) -> dict:
        return self.ping()

    @register(Dispatch.ONE_TO_ALL)
    def whole(self, data: DataProto, scale: float = 1.0) -> tuple[int, float]:
        return len(data), float(data.batch["x"].sum()) * scale

    @register(Dispatch.ONE_TO_ALL)
    def num_calls(self) -> int:
        return self.calls

    @register(Dispatch.RANK_ZERO)
    def only_rank_zero(self) -> int:
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def fail_on_rank_one(self) -> None:
        if self.rank == 1:
            raise ValueError("bad input on purpose")

    @register(Dispatch.ONE_TO_ALL)
    def fail_in_user_code(self) -> None:
        from roll_ma.envs.team_hooks import HookError

        if self.rank == 1:
            raise HookError("agent 'a': pre_process of /h.py returned str 'x'", "/h.py:1 in pre_process",
                            "ids")


class FailingWorker(Worker):
    """Its constructor raises on rank 1: a plain exception, or with ``user_error`` one of roll_ma's."""

    def __init__(self, user_error: bool = False, **kwargs):
        super().__init__(**kwargs)
        if self.rank == 1 and user_error:
            from roll_ma.errors import UserCodeError

            raise UserCodeError("the env 'x.py:E' raised", "/x.py:3 in __init__", "fix x.py")
        if self.rank == 1:
            raise ValueError("bad setting on purpose")


@pytest.fixture(scope="module")
def cluster(ray_session):
    c = Cluster("echo", EchoWorker, 2, init_kwargs={"scale": 3.0})
    yield c
    c.shutdown()


def test_worker_env_is_set_per_rank(cluster):
    envs = cluster.env()
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert {e["LOCAL_RANK"] for e in envs} == {"0"}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1 and envs[0]["MASTER_PORT"]
    assert envs[0]["CUDA_VISIBLE_DEVICES"] == ""  # no GPU asked for, none visible
    assert envs[0]["pid"] != envs[1]["pid"]


def test_dp_compute_splits_by_rank_and_keeps_order(cluster):
    data = DataProto.from_dict({"x": torch.arange(5.0)}, {"tag": list("abcde")})
    out = cluster.scaled(data)
    assert out.batch["y"].tolist() == [0.0, 3.0, 6.0, 9.0, 12.0]
    assert out.non_tensor["tag"].tolist() == list("abcde")
    assert out.non_tensor["served_by"].tolist() == [0, 0, 0, 1, 1]


def test_dp_balanced_deals_rows_by_tokens_and_keeps_order(cluster):
    """Scoring passes take as long as their tokens: rows of 9, 1, 1, 1, 8 real tokens go 9+1 | 8+1+1
    (a split by row count would give one rank 11 tokens and the other 9), and come back in order."""
    lengths = [9, 1, 1, 1, 8]
    mask = torch.tensor([[1] * n + [0] * (9 - n) for n in lengths])
    data = DataProto.from_dict({"x": torch.arange(5.0), "attention_mask": mask}, {"tag": list("abcde")})
    out = cluster.scaled_balanced(data)
    assert out.batch["y"].tolist() == [0.0, 3.0, 6.0, 9.0, 12.0]
    assert out.non_tensor["tag"].tolist() == list("abcde")
    served = out.non_tensor["served_by"].tolist()
    load = [sum(n for n, r in zip(lengths, served) if r == rank) for rank in (0, 1)]
    assert sorted(load) == [10, 10], (served, load)


def test_dp_compute_with_fewer_rows_than_ranks_calls_only_ranks_with_rows(cluster):
    before = cluster.num_calls()
    out = cluster.scaled(DataProto.from_dict({"x": torch.tensor([2.0])}))
    assert out.batch["y"].tolist() == [6.0]
    after = cluster.num_calls()
    assert after[0] == before[0] + 1 and after[1] == before[1]


def test_dp_compute_keeps_the_meta_info_of_every_rank(cluster):
    out = cluster.report(DataProto.from_dict({"x": torch.arange(5.0)}, meta_info={"step": 3}))
    assert out.meta_info["step"] == 3  # echoed by both ranks: kept once
    assert out.meta_info["metrics"] == {"rows": [3, 2], "rank": [0, 1], "scale": 3.0}  # rank 1 not dropped


def test_one_to_all_gives_every_rank_the_whole_batch(cluster):
    # the batch is put into the object store once and every rank reads it (positional or keyword)
    data = DataProto.from_dict({"x": torch.arange(6.0)}, {"tag": list("abcdef")})
    assert cluster.whole(data, scale=2.0) == [(6, 30.0), (6, 30.0)]
    assert cluster.whole(data=data) == [(6, 15.0), (6, 15.0)]


def test_a_share_of_the_ranks_calls_only_those_and_names_their_real_rank(cluster):
    # two callers, two ranks: caller 1 gets rank 1 alone (env worker i drives engine i)
    mine = cluster.share(1, 2)
    assert mine.world_size == 1 and cluster.world_size == 2
    out = mine.scaled(DataProto.from_dict({"x": torch.arange(3.0)}))
    assert out.non_tensor["served_by"].tolist() == [1, 1, 1]
    with pytest.raises(WorkerError, match="echo worker rank 1 failed in fail_on_rank_one"):
        mine.fail_on_rank_one()
    assert cluster.share(0, 1) is cluster and cluster.share(0, 2).only_rank_zero() == 0
    assert [cluster.share(c, 3)._rank_ids for c in range(3)] == [[0], [1], [0]]  # more callers than ranks


def test_rank_zero_and_non_blocking(cluster):
    assert cluster.only_rank_zero() == 0
    pending = cluster.async_scaled(DataProto.from_dict({"x": torch.ones(4)}))
    assert isinstance(pending, PendingCall) and len(pending.refs) == 2
    assert pending.get().batch["y"].tolist() == [3.0] * 4


def test_actor_exception_is_a_few_lines_naming_role_rank_and_where(cluster):
    with pytest.raises(WorkerError) as err:
        cluster.fail_on_rank_one()
    lines = str(err.value).splitlines()
    assert lines[0] == "echo worker rank 1 failed in fail_on_rank_one(): ValueError: bad input on purpose"
    assert lines[1].startswith(f"  where: {__file__}:") and lines[1].endswith(" in fail_on_rank_one")
    assert lines[2].startswith("  fix: ") and len(lines) == 3 and "\x1b[" not in str(err.value)
    assert "test_distributed.py" in err.value.details and "Traceback" not in str(err.value)  # the log's part


def test_a_user_code_error_crosses_ray_whole(cluster):
    with pytest.raises(WorkerError) as err:
        cluster.fail_in_user_code()
    assert str(err.value).splitlines() == [
        "echo worker rank 1 failed in fail_in_user_code(): agent 'a': pre_process of /h.py returned str 'x'",
        "  where: /h.py:1 in pre_process",
        "  fix: ids",
    ]


def test_a_worker_failing_in_its_constructor_is_reported_like_a_failed_call(ray_session):
    """The constructor's exception comes back through the first call (the actor stays alive until the
    cluster kills it): the same few lines as a call's failure, not an actor death."""
    with pytest.raises(WorkerError) as err:
        Cluster("boom", FailingWorker, 2)
    lines = str(err.value).splitlines()
    assert lines[0] == ("boom worker rank 1 failed to start (its __init__ raised): "
                        "ValueError: bad setting on purpose")
    assert lines[1].startswith(f"  where: {__file__}:") and lines[1].endswith(" in __init__")
    assert lines[2].startswith("  fix: ") and len(lines) == 3
    assert err.value.method == "__init__" and "test_distributed.py" in err.value.details
    with pytest.raises(WorkerError) as err:
        Cluster("boom", FailingWorker, 2, init_kwargs={"user_error": True})
    assert str(err.value).splitlines() == [
        "boom worker rank 1 failed to start (its __init__ raised): the env 'x.py:E' raised",
        "  where: /x.py:3 in __init__",
        "  fix: fix x.py",
    ]


def test_unknown_method_is_a_clear_error(cluster):
    with pytest.raises(AttributeError, match="no registered method 'nope'"):
        cluster.nope()


def test_worker_is_plain_python_without_ray():
    w = EchoWorker(role="echo", rank=0, world_size=1, scale=2.0)
    assert w.scaled(DataProto.from_dict({"x": torch.ones(2)})).batch["y"].tolist() == [2.0, 2.0]


def test_threads_and_ray_cpus_follow_the_affinity_mask_not_the_host(monkeypatch):
    # under taskset or a cpuset, os.cpu_count() is the host's count: threads sized to it oversubscribe
    from roll_ma.distributed.resources import usable_cpus
    from roll_ma.training.ds_utils import cpu_threads_per_rank

    assert 1 <= usable_cpus() <= (os.cpu_count() or 1)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 5, 6}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    assert usable_cpus() == 3
    assert cpu_threads_per_rank(1) == 3 and cpu_threads_per_rank(2) == 1 and cpu_threads_per_rank(8) == 1
    monkeypatch.delattr(os, "sched_getaffinity")  # macOS: no affinity masks, the core count it is
    assert usable_cpus() == 64


def test_device_mapping_shares_colocated_gpus():
    mapping = default_device_mapping(2, {"rollout": 2, "train": 2, "reference": 0})
    assert mapping == {"rollout": [0, 1], "train": [0, 1]}
    assert gpu_shares({"rollout": [0], "train": [0], "reference": [0]}) == {0: 0.33}
    assert gpu_shares({"rollout": [0], "train": [1]}) == {0: 1.0, 1: 1.0}
    cpu = ResourceManager.cpu_only()
    assert cpu.actor_options("train", 0) == {"num_cpus": 0.1, "num_gpus": 0}


RELEASE_SCRIPT = """
import ray
from roll_ma.distributed.resources import ResourceManager

ray.init(num_cpus=2, num_gpus=1, include_dashboard=False)  # one declared GPU: bundles, no CUDA
first = ResourceManager(1, {"train": [0]}, placement_timeout_s=30)
try:
    ResourceManager(1, {"train": [0]}, placement_timeout_s=3)
    print("SECOND_PLACED_WHILE_HELD")
except RuntimeError as e:
    print("HELD:", e)
first.release()
first.release()  # twice is harmless
ResourceManager(1, {"train": [0]}, placement_timeout_s=30).release()
print("PLACED_AFTER_RELEASE")
"""


def test_released_gpu_bundles_can_be_placed_again():
    # a second run in the same driver (a sweep, a notebook) must get the GPU back
    out = subprocess.run([sys.executable, "-c", RELEASE_SCRIPT], capture_output=True, text=True, timeout=180)
    assert "PLACED_AFTER_RELEASE" in out.stdout, out.stdout + out.stderr
    assert "HELD: Ray could not place 1 GPU bundles" in out.stdout


def test_run_workers_shutdown_kills_every_cluster_then_releases_the_gpus(ray_session):
    # a live Ray: shutdown asks nothing of one that does not answer (ray_health.ray_responds); without the
    # fixture this test passed only where an earlier test of the same worker had started Ray
    from roll_ma.pipelines.clusters import RunWorkers
    from roll_ma.workers.clients import EnvClient, RolloutClient, TrainClient

    calls = []

    class Recorder:  # a Cluster as shutdown_clusters sees it: actors without a close() to wait for
        _closable = False

        def __init__(self, name):
            self.name, self.workers = name, ["actor"]

        def _kill(self):
            calls.append(self.name)

        def release(self):
            calls.append("release")

    RunWorkers(
        RolloutClient(Recorder("rollout")), TrainClient(Recorder("train")), None, EnvClient(Recorder("env")),
        Recorder("resources"),
    ).shutdown()
    assert calls == ["env", "rollout", "train", "release"]


class FileHoldingWorker(Worker):
    """Holds a file outside its process, as a train worker holds shared-memory exports."""

    def __init__(self, path: str = "", **kwargs):
        super().__init__(**kwargs)
        self.path = f"{path}.{self.rank}"
        open(self.path, "w").close()

    def close(self) -> None:
        os.unlink(self.path)

    @register(Dispatch.ONE_TO_ALL)
    def busy(self, seconds: float) -> None:
        import time

        time.sleep(seconds)


def test_shutdown_lets_every_worker_free_what_it_holds_then_kills_a_busy_one(ray_session, tmp_path):
    import ray

    from roll_ma.distributed.cluster import shutdown_clusters

    idle = Cluster("idle", FileHoldingWorker, 2, init_kwargs={"path": str(tmp_path / "idle")})
    busy = Cluster("busy", FileHoldingWorker, 1, init_kwargs={"path": str(tmp_path / "busy")})
    actor = busy.workers[0]
    busy.async_busy(600)  # its close() waits behind this call: it is killed when the short wait is over
    shutdown_clusters([idle, None, busy], close_timeout_s=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy.0"]  # the next run sweeps such files
    assert idle.workers == [] and busy.workers == []
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(actor.ping.remote(), timeout=60)
