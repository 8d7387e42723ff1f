"""SFT and DPO through the multi-agent strategy: per-agent isolation (bit for bit), the reference copy,
the DPO margin growing, optimizer resets."""

from __future__ import annotations

import math

import pytest
import torch
from train_helpers import all_finite

from roll_ma.data.rows import pair_rows, sft_rows
from roll_ma.protocol.requests import DPOSettings, UpdateRequest

AGENTS = ["a0", "a1"]
ALL = AGENTS + [a + "__ref" for a in AGENTS]  # the adapters and their frozen reference copies
PAD = 0


def _tokens(gen: torch.Generator, n: int, lo: int = 2, hi: int = 6) -> list[list[int]]:
    return [
        torch.randint(3, 512, (int(torch.randint(lo, hi, (1,), generator=gen)),), generator=gen).tolist()
        for _ in range(n)
    ]


def sft_batch(agent_ids: list[int], seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    rows = sft_rows(_tokens(gen, len(agent_ids)), _tokens(gen, len(agent_ids)), agent_ids, PAD)
    return rows


def sft(step: int = 0) -> UpdateRequest:
    return UpdateRequest(step=step, objective="sft")


def dpo(step: int = 0, beta: float = 0.1, rpo_alpha: float = 0.0) -> UpdateRequest:
    return UpdateRequest(step=step, objective="dpo", dpo=DPOSettings(beta, 0.0, rpo_alpha))


def dpo_batch(
    strategy,
    agent_ids: list[int],
    seed: int = 0,
    reference: str = "copy",
):
    gen = torch.Generator().manual_seed(seed)
    n = len(agent_ids)
    pairs = pair_rows(_tokens(gen, n), _tokens(gen, n), _tokens(gen, n), agent_ids, PAD)
    return pairs.union(strategy.compute_pair_ref_log_probs(pairs, reference))


def _same_state(a: dict, b: dict) -> bool:
    for key in ("exp_avg", "exp_avg_sq", "step"):
        if len(a[key]) != len(b[key]) or not all(torch.equal(x, y) for x, y in zip(a[key], b[key])):
            return False
    return a["global_steps"] == b["global_steps"] and a["scheduler_steps"] == b["scheduler_steps"]


def _all_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("zero_stage", [0, 1, 2])
def test_sft_and_dpo_touch_only_their_agent(make_strategy, zero_stage):
    s = make_strategy(AGENTS, zero_stage=zero_stage, reference_copies=True)
    s.snapshot_reference()
    for step, (objective, k) in enumerate([("sft", 0), ("dpo", 1), ("sft", 1), ("dpo", 0), ("dpo", 1)]):
        batch = sft_batch([k] * 4, seed=step) if objective == "sft" else dpo_batch(s, [k] * 4, seed=step)
        weights, states = s.adapter_tensors(ALL), {a: s.optimizer_state(a) for a in AGENTS}
        metrics = s.train_step(batch, sft() if objective == "sft" else dpo()).metrics
        new_weights, new_states = s.adapter_tensors(ALL), {a: s.optimizer_state(a) for a in AGENTS}
        trained, other = AGENTS[k], AGENTS[1 - k]
        assert metrics[f"agent/{trained}/updated"] == 1.0 and all_finite(metrics)
        key = "sft_loss" if objective == "sft" else "dpo_loss"
        assert f"agent/{trained}/{key}" in metrics and f"agent/{other}/{key}" not in metrics
        assert all(not torch.equal(weights[trained][n], new_weights[trained][n]) for n in weights[trained]), (
            f"step {step}: some tensor of {trained} did not move"
        )
        assert new_states[trained]["global_steps"] == states[trained]["global_steps"] + 1
        assert metrics[f"agent/{other}/updated"] == 0.0
        assert _all_equal(weights[other], new_weights[other]), (
            f"{objective} of {trained} changed {other}'s adapter"
        )
        assert _same_state(states[other], new_states[other]), (
            f"{objective} of {trained} changed {other}'s Adam"
        )
        # the frozen reference copies never train
        for a in AGENTS:
            assert _all_equal(weights[a + "__ref"], new_weights[a + "__ref"])


def test_dpo_starts_at_the_reference_and_its_margin_grows(make_strategy):
    s = make_strategy(AGENTS, reference_copies=True, lr=5e-3)
    s.snapshot_reference()
    batch = dpo_batch(s, [0] * 8, seed=7)
    margins, accuracies = [], []
    for step in range(6):
        m = s.train_step(batch, dpo(step, beta=0.5)).metrics
        margins.append(m["agent/a0/rewards/margins"])
        accuracies.append(m["agent/a0/rewards/accuracies"])
        if step == 0:
            # the policy IS its frozen copy: every implicit reward is 0 and the loss is log 2
            assert m["agent/a0/rewards/chosen"] == 0.0 and m["agent/a0/rewards/rejected"] == 0.0
            assert m["agent/a0/dpo_loss"] == pytest.approx(math.log(2), abs=1e-6)
            assert m["agent/a0/pairs"] == 8.0
    assert all(b > a for a, b in zip(margins, margins[1:])), f"margins did not grow: {margins}"
    assert accuracies[-1] == 1.0
    # after training, chosen beats rejected under the policy by more than under the reference
    ref = s.compute_pair_ref_log_probs(batch, "copy")
    assert torch.equal(
        ref.batch["ref_chosen_logps"], batch.batch["ref_chosen_logps"]
    )  # the copy stayed frozen


def test_reference_base_differs_from_the_copy(make_strategy):
    s = make_strategy(AGENTS, reference_copies=True)
    s.snapshot_reference()
    batch = dpo_batch(s, [0, 1, 0], seed=3)
    base = s.compute_pair_ref_log_probs(batch, "base")
    # the test adapters have nonzero lora_B: the base scores differently from the adapter's copy
    assert not torch.equal(base.batch["ref_chosen_logps"], batch.batch["ref_chosen_logps"])
    # the copy scores exactly like the adapter itself (standard rows of the chosen responses)
    from roll_ma.training.objective_dpo import side

    chosen = side(batch, "chosen")
    own = s.compute_log_probs(chosen).batch["old_log_probs"]
    expected = (own * chosen.batch["response_mask"]).sum(-1)
    assert torch.allclose(batch.batch["ref_chosen_logps"], expected, atol=1e-5)


def test_no_copies_no_copy_reference(make_strategy):
    s = make_strategy(AGENTS)
    batch = dpo_batch(s, [0], seed=1, reference="base")
    with pytest.raises(ValueError, match="frozen reference copy"):
        s.compute_pair_ref_log_probs(batch, "copy")
    with pytest.raises(ValueError, match="reference copies"):
        s.snapshot_reference()


def test_sft_lowers_the_nll_and_reset_gives_a_fresh_optimizer(make_strategy):
    s = make_strategy(AGENTS, lr=5e-3, warmup_steps=2)
    batch = sft_batch([0] * 6 + [1] * 6, seed=5)
    losses = []
    for step in range(4):
        losses.append(s.train_step(batch, sft(step)).metrics["agent/a0/sft_loss"])
    assert losses[-1] < losses[0]
    before = s.adapter_tensors()
    state = s.optimizer_state("a0")
    assert state["exp_avg"] and state["scheduler_steps"] == 4
    s.reset_optimizers()
    fresh = s.optimizer_state("a0")
    assert fresh["exp_avg"] == [] and fresh["scheduler_steps"] == 0 and fresh["lr"] == pytest.approx(5e-3 / 2)
    assert all(_all_equal(before[a], s.adapter_tensors()[a]) for a in AGENTS)  # weights untouched
    m = s.train_step(batch, sft()).metrics  # and it trains on from there
    assert m["agent/a0/updated"] == 1.0 and s.optimizer_state("a0")["scheduler_steps"] == 1


def test_missing_reference_log_probs_are_refused(make_strategy):
    s = make_strategy(AGENTS)
    gen = torch.Generator().manual_seed(0)
    pairs = pair_rows(_tokens(gen, 2), _tokens(gen, 2), _tokens(gen, 2), [0, 1], PAD)
    with pytest.raises(ValueError, match="ref_chosen_logps"):
        s.train_step(pairs, dpo())


def test_rpo_adds_the_chosen_nll(make_strategy):
    """rpo_alpha > 0 reports the chosen responses' token NLL, and its gradient moves the policy further."""
    from roll_ma.training.objective_dpo import side

    plain, rpo = (make_strategy(AGENTS, reference_copies=True) for _ in range(2))
    for s in (plain, rpo):
        s.snapshot_reference()
    batch = dpo_batch(rpo, [0] * 4, seed=11)
    chosen = side(batch, "chosen")
    lp = rpo.compute_log_probs(chosen).batch["old_log_probs"]
    mask = chosen.batch["response_mask"]
    nll = float(-(lp * mask).sum() / mask.sum())  # token mean over every chosen token
    m = rpo.train_step(batch, dpo(rpo_alpha=1.0)).metrics
    assert m["agent/a0/nll_loss"] == pytest.approx(nll, rel=1e-5)
    assert m["agent/a0/dpo_loss"] == pytest.approx(math.log(2), abs=1e-6)  # the DPO part alone
    m_plain = plain.train_step(batch, dpo(rpo_alpha=0.0)).metrics
    assert "agent/a0/nll_loss" not in m_plain
    a, b = plain.adapter_tensors(["a0"])["a0"], rpo.adapter_tensors(["a0"])["a0"]
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the NLL term changed the update
