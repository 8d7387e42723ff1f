"""Rows whose reply is empty (a turn that ended at once, a generation cut at zero tokens) in the update:
a micro-batch holding only such rows backpropagates zeros (DeepSpeed refuses a loss that is not on the
graph), and the step's gradient is the one the other rows alone give."""

from __future__ import annotations

import pytest
import torch
from train_helpers import make_batch, make_group_batch, on_policy

from roll_ma.config.schema import AlgorithmConfig, CriticConfig
from roll_ma.protocol import DataProto
from roll_ma.training.policy_engine import PolicyEngine


@pytest.fixture
def gradients(monkeypatch):
    """Every optimizer step's accumulated gradients (this policy's parameters in order), before the step."""
    seen: list[list[torch.Tensor]] = []
    original = PolicyEngine.optimizer_step

    def recording(self):
        seen.append([p.grad.detach().clone() for p in self.params if p.grad is not None])
        return original(self)

    monkeypatch.setattr(PolicyEngine, "optimizer_step", recording)
    return seen


def with_empty_replies(batch: DataProto, rows: list[int]) -> DataProto:
    """``batch`` (changed in place) with the replies of ``rows`` removed: no response token, advantage 0."""
    t = batch.batch
    width = t["responses"].shape[1]  # the last ``width`` columns are the response
    for i in rows:
        for key in ("response_mask", "responses", "advantages"):
            t[key][i] = 0
        t["attention_mask"][i, -width:] = 0
        t["input_ids"][i, -width:] = 0
    return batch


def assert_same_gradients(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b) > 0
    assert any(bool(g.abs().sum() > 0) for g in a)  # the real rows gave a gradient
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-7, msg=f"parameter {i}")


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_micro_batch_of_empty_replies_adds_nothing(make_strategy, gradients, packed):
    """Rows 2 and 3 lose their replies; an 8-token budget puts them in a micro-batch of their own. The
    update runs, counts only the real rows' tokens, and its gradient is that of the batch without them."""
    full = with_empty_replies(make_batch([0, 0, 0, 0, 0], seed=3), [2, 3])
    kept = full.select_idxs([0, 1, 4])
    for batch in (full, kept):
        s = make_strategy(["a0"], max_tokens_per_micro_batch=8, remove_padding=packed)
        metrics = s.train_step(on_policy(s, batch, ref=True)).metrics
        assert metrics["agent/a0/tokens"] == float(kept.batch["response_mask"].sum())
    assert_same_gradients(*gradients)


def test_micro_batch_of_empty_replies_at_zero_2(make_strategy):
    """ZeRO-2 (gradients in DeepSpeed's partitioned buffers, reduced at the boundary): the same batch's
    step runs and moves the adapter."""
    s = make_strategy(["a0"], zero_stage=2, max_tokens_per_micro_batch=8)
    before = s.adapter_tensors(["a0"])["a0"]
    s.train_step(on_policy(s, with_empty_replies(make_batch([0, 0, 0, 0, 0], seed=3), [2, 3]), ref=True))
    after = s.adapter_tensors(["a0"])["a0"]
    assert any(not torch.equal(after[k], before[k]) for k in after)


def test_shared_prompt_group_with_empty_replies(make_strategy, gradients):
    """Packed rows whose GRPO group runs its prompt once, some of the group's replies empty, a budget that
    splits the group: the gradient is the one without prompt sharing."""
    for share in (False, True):
        batch = with_empty_replies(make_group_batch(agents=1, groups=2, samples=4, seed=4), [0, 2, 5])
        s = make_strategy(["a0"], remove_padding=True, share_prompt_prefix=share,
                          max_tokens_per_micro_batch=12)
        s.train_step(on_policy(s, batch, ref=True))
    assert_same_gradients(*gradients)


def test_critic_update_with_a_micro_batch_of_empty_replies(make_strategy):
    """The value critic (GAE) and the policy on rows, two of them without a reply, in micro-batches of
    their own: the step runs and both the policy's adapter and the critic's move."""
    s = make_strategy(["a0"], algo=AlgorithmConfig(advantage="gae"), critic=CriticConfig(lr=1e-2),
                      max_tokens_per_micro_batch=8)
    batch = on_policy(s, with_empty_replies(make_batch([0, 0, 0, 0], seed=5), [1, 2]))
    batch.batch["values"] = s.compute_values(batch).batch["values"]
    batch.batch["returns"] = batch.batch["response_mask"].clone()  # (B, R) target 1 on real tokens
    names = ["a0", s.critic.names[0]]
    before = {n: s.adapter_tensors([n])[n] for n in names}
    s.train_step(batch)
    for name in names:
        after = s.adapter_tensors([name])[name]
        assert any(not torch.equal(after[k], before[name][k]) for k in after), name
