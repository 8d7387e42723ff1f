"""Two train ranks through Ray (gloo) give the same update as one rank on the same batch."""

from __future__ import annotations

import pytest
import torch
from train_helpers import learning_metrics, make_batch, worker_spec

from roll_ma.config.schema import AgentConfig, AlgorithmConfig, ModelConfig, TrainConfig
from roll_ma.protocol.requests import ScoreRequest, UpdateRequest

# a0: 5 rows -> mini-batches of 4 + 1 (the 1-row one leaves rank 1 only padding); a1: 3 rows (uneven split);
# micro_batch_size=1: gradient accumulation over 2 micro-batches per rank, one of them all padding on rank 1
AGENT_IDS = [0, 1, 0, 2, 0, 1, 0, 2, 1, 0, 2, 2]
# eps=1e-3 keeps Adam's first steps proportional to the gradient, so summation-order rounding between 1 and 2
# ranks stays at float level instead of becoming lr * sign(g) flips on near-zero gradient entries
TRAIN = dict(mini_batch_size=4, micro_batch_size=1, ppo_epochs=2, eps=1e-3, lr=1e-2)
ALGO = AlgorithmConfig(kl_coef=0.1, entropy_coef=0.01)


@pytest.mark.parametrize("zero_stage", [0, 1, 2])  # three gradient-reduction paths in DeepSpeed
def test_two_ranks_match_one_rank(ray_session, make_strategy, tiny_model_dir, adapter_init_dir, tmp_path,
                                  zero_stage):
    from roll_ma.distributed.cluster import Cluster
    from roll_ma.workers.train_worker import TrainWorker

    agents = [AgentConfig(name=n, init_adapter=adapter_init_dir(n)) for n in ("a0", "a1", "a2")]
    train = TrainConfig(zero_stage=zero_stage, **TRAIN)
    spec = worker_spec(ModelConfig(path=tiny_model_dir), agents, train=train, algorithm=ALGO)
    cluster = Cluster("train", TrainWorker, 2, env_vars={"DS_ACCELERATOR": "cpu"}, init_kwargs={"spec": spec})
    try:
        cluster.init_model()
        single = make_strategy(agents, algo=ALGO, zero_stage=zero_stage, **TRAIN)

        batch = make_batch(AGENT_IDS, seed=70)
        request, scoring = UpdateRequest(step=4), ScoreRequest(temperature=1.0)
        # dp_compute: rows split over the ranks
        old = cluster.compute_log_probs(batch, scoring).batch["old_log_probs"]
        assert torch.allclose(old, single.compute_log_probs(batch).batch["old_log_probs"], atol=1e-6)
        batch.batch["old_log_probs"] = old
        batch.batch["ref_log_probs"] = cluster.compute_ref_log_probs(batch, scoring).batch["ref_log_probs"]

        per_rank = [learning_metrics(m.metrics) for m in cluster.train_step(batch, request)]
        assert per_rank[0] == per_rank[1]  # all-reduced: every rank reports the same numbers
        want = learning_metrics(single.train_step(batch, request).metrics)
        assert per_rank[0].keys() == want.keys()
        for key, value in want.items():
            assert per_rank[0][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key

        got_w, want_w = cluster.adapter_tensors(), single.adapter_tensors()
        for name in want_w:
            diff = max((got_w[name][k] - want_w[name][k]).abs().max().item() for k in want_w[name])
            assert diff < 1e-6, f"{name}: 2 ranks differ from 1 rank by {diff}"

        cluster.save_checkpoint(str(tmp_path))  # ZeRO 1/2: every rank writes its own optimizer shard
        shards = ["rank0.pt", "rank1.pt"] if zero_stage > 0 else ["rank0.pt"]
        assert sorted(p.name for p in (tmp_path / "optim" / "a0").iterdir()) == shards
        cluster.load_checkpoint(str(tmp_path))
        reloaded = cluster.adapter_tensors()
        assert all(torch.equal(reloaded[n][k], got_w[n][k]) for n in got_w for k in got_w[n])
    finally:
        cluster.shutdown()


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_two_ranks_distill_like_one_rank(ray_session, make_strategy, tiny_model_dir, adapter_init_dir,
                                         zero_stage):
    """Joint search's distillation: both ranks get every row, take the same steps, end as one rank does."""
    from test_joint_search_train import _rows

    from roll_ma.distributed.cluster import Cluster
    from roll_ma.studies.joint_search_train import distill_choices
    from roll_ma.workers.train_worker import TrainWorker

    agents = [AgentConfig(name=n, init_adapter=adapter_init_dir(n)) for n in ("a0", "a1")]
    train = TrainConfig(zero_stage=zero_stage, lr=1e-2)
    spec = worker_spec(ModelConfig(path=tiny_model_dir), agents, train=train)
    cluster = Cluster("train", TrainWorker, 2, env_vars={"DS_ACCELERATOR": "cpu"}, init_kwargs={"spec": spec})
    try:
        cluster.init_model()
        single = make_strategy(agents, zero_stage=zero_stage, lr=1e-2)
        rows = _rows([1, 0], [0, 1])
        per_rank = cluster.train_with(distill_choices, rows, 15, 0.99)
        assert per_rank[0] == per_rank[1] and per_rank[0]["a0/steps"] > 0
        want = distill_choices(single, rows, 15, 0.99)
        assert per_rank[0].keys() == want.keys() and per_rank[0]["a1/steps"] == want["a1/steps"]
        got_w, want_w = cluster.adapter_tensors(), single.adapter_tensors()
        for name in want_w:
            diff = max((got_w[name][k] - want_w[name][k]).abs().max().item() for k in want_w[name])
            assert diff < 1e-5, f"{name}: 2 ranks differ from 1 rank by {diff}"
    finally:
        cluster.shutdown()


@pytest.mark.parametrize(("zero_stage", "share"), [(0, True), (2, False)])
def test_two_ranks_train_the_critic_like_one_rank(ray_session, make_strategy, tiny_model_dir,
                                                  adapter_init_dir, zero_stage, share):
    """PPO with a value critic: values split over the ranks, the critic's gradients all-reduced; a shared
    critic (ZeRO-0) and per-agent critics (ZeRO-2) end as one rank does, agents and critics alike."""
    from roll_ma.config.schema import CriticConfig
    from roll_ma.distributed.cluster import Cluster
    from roll_ma.workers.train_worker import TrainWorker

    agents = [AgentConfig(name=n, init_adapter=adapter_init_dir(n)) for n in ("a0", "a1", "a2")]
    algo = AlgorithmConfig(advantage="gae")
    critic = CriticConfig(share=share, lr=1e-2)
    train = TrainConfig(zero_stage=zero_stage, **TRAIN)
    spec = worker_spec(ModelConfig(path=tiny_model_dir), agents, train=train, algorithm=algo, critic=critic)
    cluster = Cluster("train", TrainWorker, 2, env_vars={"DS_ACCELERATOR": "cpu"}, init_kwargs={"spec": spec})
    try:
        cluster.init_model()
        single = make_strategy(agents, algo=algo, zero_stage=zero_stage, critic=critic, **TRAIN)

        batch = make_batch(AGENT_IDS, seed=71)
        request = UpdateRequest(step=4)
        batch.batch["old_log_probs"] = single.compute_log_probs(batch).batch["old_log_probs"]
        values = cluster.compute_values(batch).batch["values"]  # (B, R) dp_compute: rows split over the ranks
        torch.testing.assert_close(values, single.compute_values(batch).batch["values"], atol=1e-6, rtol=1e-5)
        batch.batch["values"] = values
        batch.batch["returns"] = batch.batch["response_mask"] * torch.linspace(-1, 1, len(AGENT_IDS))[:, None]

        critics = single.critic.names
        before = single.adapter_tensors(critics)
        per_rank = [learning_metrics(m.metrics) for m in cluster.train_step(batch, request)]
        assert per_rank[0] == per_rank[1]  # all-reduced: every rank reports the same numbers
        want = learning_metrics(single.train_step(batch, request).metrics)
        assert per_rank[0].keys() == want.keys()
        assert all(want[f"critic/{name}/updated"] == 1.0 for name in critics)
        moved = single.adapter_tensors(critics)  # 2 ranks == 1 rank must not hold by neither moving
        assert all(any(not torch.equal(before[n][k], moved[n][k]) for k in moved[n]) for n in critics)
        for key, value in want.items():
            # a clip fraction counts tokens at |v - v_old| > clip: one token on the boundary (values agree to
            # 1e-6 between layouts) flips it by 1/33; the weights below are the exact check
            tol = 0.05 if key.endswith("clip_frac") else 1e-6
            assert per_rank[0][key] == pytest.approx(value, rel=1e-4, abs=tol), key

        names = critics + ["a0", "a1", "a2"]
        got_w, want_w = cluster.adapter_tensors(names), single.adapter_tensors(names)
        for name in names:
            diff = max((got_w[name][k] - want_w[name][k]).abs().max().item() for k in want_w[name])
            assert diff < 1e-6, f"{name}: 2 ranks differ from 1 rank by {diff}"
        after = make_batch(AGENT_IDS, seed=72)  # the heads too: the values the updated critics give now
        torch.testing.assert_close(cluster.compute_values(after).batch["values"],
                                   single.compute_values(after).batch["values"], atol=1e-5, rtol=1e-4)
    finally:
        cluster.shutdown()
