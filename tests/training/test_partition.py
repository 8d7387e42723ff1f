"""Rows train only their own agent's adapter; frozen, not-due, row-less and one-row agents behave."""

from __future__ import annotations

import pytest
import torch
from train_helpers import all_finite, make_batch, on_policy

from roll_ma.config.run_plan import run_plan
from roll_ma.config.schema import AgentConfig, RunConfig
from roll_ma.protocol.requests import UpdateRequest


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_zero_advantage_agent_does_not_move(make_strategy):
    s = make_strategy(["a0", "a1"])
    batch = make_batch([0, 1, 0, 1, 0, 1], seed=1)
    batch.batch["advantages"][torch.tensor([0, 2, 4])] = 0.0  # a0: no signal (no kl, no entropy terms)
    before = s.adapter_tensors()
    metrics = s.train_step(on_policy(s, batch)).metrics
    after = s.adapter_tensors()
    assert _equal(before["a0"], after["a0"])
    assert not _equal(before["a1"], after["a1"])
    assert metrics["agent/a0/policy_loss"] == 0.0 and all_finite(metrics)


def test_rows_of_one_agent_never_reach_another(make_strategy):
    rows = make_batch([0, 1, 0, 1, 0, 1], seed=2)
    rows.batch["advantages"][torch.tensor([1, 3, 5])] *= 1e4  # a1's rows shout
    with_a1 = make_strategy(["a0", "a1"])
    with_a1.train_step(on_policy(with_a1, rows))
    without_a1 = make_strategy(["a0", "a1"])
    without_a1.train_step(on_policy(without_a1, rows.select_idxs([0, 2, 4])))
    assert _equal(with_a1.adapter_tensors()["a0"], without_a1.adapter_tensors()["a0"])
    assert not _equal(with_a1.adapter_tensors()["a1"], without_a1.adapter_tensors()["a1"])


def test_shared_adapter_updates_from_union_of_rows(make_strategy):
    rows = make_batch([0, 1, 0, 1, 1, 0], seed=3)
    pair = make_strategy([AgentConfig(name="p0", adapter="shared"), AgentConfig(name="p1", adapter="shared")])
    metrics = pair.train_step(on_policy(pair, rows)).metrics
    union = make_strategy([AgentConfig(name="u", adapter="shared")])
    union_rows = rows.select()
    union_rows.non_tensor["agent_id"] = [0] * len(rows)
    union.train_step(on_policy(union, union_rows))
    got, want = pair.adapter_tensors()["shared"], union.adapter_tensors()["shared"]
    assert all(torch.allclose(got[k], want[k], rtol=0, atol=1e-7) for k in want)
    assert metrics["agent/p0/rows"] == 3 and metrics["agent/p1/rows"] == 3
    assert metrics["agent/p0/updated"] == 1.0 and metrics["agent/p1/updated"] == 1.0
    assert pair.optimizer_state("shared")["global_steps"] == 1  # one optimizer step for both agents' rows


def test_frozen_agent_never_changes_and_has_no_optimizer(make_strategy):
    s = make_strategy(["a0", AgentConfig(name="opponent", frozen=True)])
    before = s.adapter_tensors()
    for step in range(2):
        rows = on_policy(s, make_batch([0, 1, 1, 0], seed=step))
        result = s.train_step(rows, UpdateRequest(step=step))
        metrics = result.metrics
        assert metrics["agent/opponent/updated"] == 0.0 and metrics["agent/opponent/rows"] == 2
        assert result.updated_adapters == ("a0",) and result.stepped_agents == (0,)
    assert _equal(before["opponent"], s.adapter_tensors()["opponent"])
    assert not _equal(before["a0"], s.adapter_tensors()["a0"])
    with pytest.raises(KeyError):
        s.optimizer_state("opponent")


def test_the_update_trains_only_the_agents_its_request_names_as_due(make_strategy):
    """The train workers apply no cycle of their own: the request carries the run plan's due agents."""
    agents = [AgentConfig(name="slow", update_every=2), AgentConfig(name="fast")]
    plan = run_plan(RunConfig(agents=agents))
    s = make_strategy(agents)
    for step in (1, 2, 3):
        before = s.adapter_tensors()
        request = UpdateRequest(step=step, agents=plan.due_agents(step))
        result = s.train_step(on_policy(s, make_batch([0, 1, 0, 1], seed=step)), request)
        moved = not _equal(before["slow"], s.adapter_tensors()["slow"])
        assert moved == (step % 2 == 0) and result.metrics["agent/slow/updated"] == float(step % 2 == 0)
        assert result.metrics["agent/fast/updated"] == 1.0
        # the typed answer the pipeline pushes and counts from: the same agents, no metric name parsed
        assert result.stepped_agents == ((0, 1) if step % 2 == 0 else (1,))
        assert result.updated_adapters == (("slow", "fast") if step % 2 == 0 else ("fast",))


def test_no_rows_and_one_row(make_strategy):
    s = make_strategy(["a0", "a1", "a2"])
    before = s.adapter_tensors()
    metrics = s.train_step(on_policy(s, make_batch([2, 0, 2, 2], seed=4))).metrics  # a0: one row, a1: none
    assert all_finite(metrics)
    assert metrics["agent/a1/rows"] == 0 and metrics["agent/a1/updated"] == 0.0
    assert _equal(before["a1"], s.adapter_tensors()["a1"]) and s.optimizer_state("a1")["global_steps"] == 0
    assert metrics["agent/a0/rows"] == 1 and metrics["agent/a0/updated"] == 1.0
    for name in ("policy_loss", "entropy", "clip_frac", "grad_norm", "lr"):
        assert f"agent/a0/{name}" in metrics
    # wall-clock seconds of each adapter that was updated, and only of those
    assert {k for k in metrics if k.startswith("timing/update/")} == {"timing/update/a0", "timing/update/a2"}
    empty = s.train_step(make_batch([], seed=5)).metrics  # a batch with no rows at all
    assert all_finite(empty) and all(empty[f"agent/{a}/rows"] == 0 for a in ("a0", "a1", "a2"))


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_micro_batch_size_does_not_change_the_update(make_strategy, zero_stage):
    rows = make_batch([0] * 8, seed=6)
    results = []
    for micro in (1, 8):
        # eps=1e-3 keeps Adam's first step proportional to the gradient; at eps=1e-8 it is ~lr * sign(g),
        # which turns float rounding of near-zero gradient entries (summation order) into lr-sized jumps
        s = make_strategy(["a0"], zero_stage=zero_stage, micro_batch_size=micro, eps=1e-3)
        metrics = s.train_step(on_policy(s, rows)).metrics
        results.append((s.adapter_tensors()["a0"], metrics))
    (w1, m1), (w8, m8) = results
    assert max((w1[k] - w8[k]).abs().max().item() for k in w1) <= 1e-6
    assert m1["agent/a0/grad_norm"] == pytest.approx(m8["agent/a0/grad_norm"], rel=1e-5)
    assert m1["agent/a0/policy_loss"] == pytest.approx(m8["agent/a0/policy_loss"], rel=1e-5, abs=1e-7)


def test_overflowed_gradient_skips_the_step_and_keeps_weights(make_strategy):
    """A non-finite gradient (bf16 overflow on a GPU) must not turn an adapter or its Adam state into NaN."""
    s = make_strategy(["a0", "a1"])
    batch = on_policy(s, make_batch([0, 0, 0, 1], seed=5))
    batch.batch["advantages"][0, 0] = float("inf")  # one poisoned token of agent a0
    before = s.adapter_tensors()
    metrics = s.train_step(batch).metrics
    after = s.adapter_tensors()
    assert metrics["agent/a0/skipped_nonfinite"] == 1.0 and metrics["agent/a0/updated"] == 0.0
    assert all(torch.equal(before["a0"][k], after["a0"][k]) for k in before["a0"])
    assert all(torch.isfinite(v).all() for v in after["a0"].values())
    assert metrics["agent/a1/updated"] == 1.0  # the other agent still trains
