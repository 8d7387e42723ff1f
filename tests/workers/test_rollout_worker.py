"""RolloutWorker: as a plain object (hf), and as Ray actors (hf on two ranks, vllm inside an actor)."""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import AGENTS, GREEDY, LORA, SEED, TEXTS, make_request, responses_of, rollout_cfg

from roll_ma.distributed.tensor_transfer import pack_tensors
from roll_ma.protocol.requests import GenerateRequest
from roll_ma.workers.rollout_worker import RolloutWorker
from roll_ma.workers.worker_specs import RolloutWorkerSpec

AGENT_IDS = [0, 1, 2, 1, 0, 1]


def _init_kwargs(model_cfg, backend: str, **overrides) -> dict:
    return {"spec": RolloutWorkerSpec(model=model_cfg, lora=LORA, agents=tuple(AGENTS),
                                      rollout=rollout_cfg(backend=backend, **overrides), seed=SEED)}


def test_worker_without_ray(rollout_model_cfg, tokenizer, make_adapter_tensors):
    worker = RolloutWorker("rollout", 0, 1, {}, **_init_kwargs(rollout_model_cfg, "hf"))
    with pytest.raises(RuntimeError, match="init_model"):
        worker.adapter_versions()
    worker.init_model()
    assert worker.adapter_versions() == {"a0": 0, "a1": 0}
    assert set(worker.update_adapters(make_adapter_tensors(1), 1)) == {"a0", "a1"}
    out = worker.generate(make_request(tokenizer, TEXTS, AGENT_IDS), GREEDY)
    assert out.non_tensor["adapter_version"].tolist() == [1] * len(TEXTS)
    scored = worker.score(out)
    torch.testing.assert_close(
        # decode vs forward
        scored.batch["rollout_log_probs"], out.batch["rollout_log_probs"], atol=5e-5, rtol=0
    )
    # the packed form train workers export installs the very same weights
    packed = {name: pack_tensors(t) for name, t in make_adapter_tensors(1).items()}
    assert set(worker.update_adapters(packed, 2)) == {"a0", "a1"}
    rescored = worker.score(out)
    assert worker.adapter_versions() == {"a0": 2, "a1": 2}
    assert torch.equal(rescored.batch["rollout_log_probs"], scored.batch["rollout_log_probs"])
    worker.update_adapters({n: pack_tensors(t) for n, t in make_adapter_tensors(2).items()}, 3)
    assert not torch.equal(worker.score(out).batch["rollout_log_probs"], scored.batch["rollout_log_probs"])
    worker.sleep()
    worker.wake_up()


def test_two_hf_ranks_split_rows_without_changing_samples(
    ray_session, rollout_model_cfg, tokenizer, make_adapter_tensors
):
    """DP_COMPUTE spreads rows over the ranks; seeded samples equal one local worker's; the versions of
    every rank are checked, so an engine of rank 1 that missed a sync stops the run."""
    import ray

    from roll_ma.distributed.cluster import Cluster
    from roll_ma.pipelines.rl.adapter_sync import check_versions

    cluster = Cluster("rollout", RolloutWorker, 2, init_kwargs=_init_kwargs(rollout_model_cfg, "hf"))
    try:
        cluster.init_model()
        cluster.update_adapters(make_adapter_tensors(1), 3)
        assert cluster.adapter_versions() == [{"a0": 3, "a1": 3}] * 2  # one report per engine
        check_versions(cluster.adapter_versions(), ["a0", "a1"], 3)
        # rank 1's engine gets a1's version 3 again as version 2 (a sync that reached rank 0 only looks so)
        ray.get(cluster.workers[1].update_adapters.remote({"a1": make_adapter_tensors(1)["a1"]}, 2))
        assert cluster.adapter_versions() == [{"a0": 3, "a1": 3}, {"a0": 3, "a1": 2}]
        stale = r"1 of 2 rollout engines serve other adapter versions \(rank 1: \{'a1': 2\}"
        with pytest.raises(RuntimeError, match=stale):
            check_versions(cluster.adapter_versions(), ["a0", "a1"], 3)
        check_versions(cluster.adapter_versions(), ["a0"], 3)  # a sync of a0 alone leaves a1 as it was
        cluster.update_adapters(make_adapter_tensors(1), 3)
        request = make_request(tokenizer, TEXTS, AGENT_IDS, list(range(len(TEXTS))))
        remote = cluster.generate(request, GenerateRequest(seed=4))
        local = RolloutWorker("rollout", 0, 1, {}, **_init_kwargs(rollout_model_cfg, "hf"))
        local.init_model()
        local.update_adapters(make_adapter_tensors(1), 3)
        assert responses_of(remote) == responses_of(local.generate(request, GenerateRequest(seed=4)))
        assert remote.non_tensor["adapter_version"].tolist() == [3] * len(TEXTS)
    finally:
        cluster.shutdown()


@pytest.mark.slow
def test_vllm_worker_inside_a_ray_actor(ray_session, rollout_model_cfg, tokenizer, make_adapter_tensors):
    pytest.importorskip("vllm")
    from roll_ma.distributed.cluster import Cluster

    kwargs = _init_kwargs(
        rollout_model_cfg, "vllm", enforce_eager=True, max_num_seqs=16, engine_kwargs={"max_model_len": 256}
    )
    cluster = Cluster("rollout", RolloutWorker, 1, init_kwargs=kwargs)
    try:
        cluster.init_model()
        assert cluster.adapter_versions() == [{"a0": 0, "a1": 0}]
        cluster.update_adapters(make_adapter_tensors(1), 2)
        request = make_request(tokenizer, TEXTS, AGENT_IDS)
        out = cluster.generate(request, GREEDY)
        assert out.non_tensor["adapter_version"].tolist() == [2] * len(TEXTS)
        assert out.batch["response_mask"].sum() > 0
        scored = cluster.score(out)
        torch.testing.assert_close(
            scored.batch["rollout_log_probs"], out.batch["rollout_log_probs"], atol=2e-3, rtol=0
        )
        cluster.sleep()
        cluster.wake_up()
        cluster.shutdown_engine()
    finally:
        cluster.shutdown()
