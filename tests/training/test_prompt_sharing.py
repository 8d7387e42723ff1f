"""train.share_prompt_prefix: a GRPO group's prompt runs once in the scoring and update passes, and
every number is the one the repeated prompts gave (fp32 on CPU: log-probs to ~1e-5, LoRA gradients)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from train_helpers import make_group_batch, on_policy

import roll_ma.models.logprobs as logprobs
from roll_ma.config import ConfigError
from roll_ma.config.run_plan import prompt_sharing, prompt_sharing_note, run_plan
from roll_ma.config.schema import ModelConfig, RunConfig, TrainConfig
from roll_ma.packing import (
    pack_sequences,
    prompt_groups,
    shared_lengths,
    shared_prefix_lens,
    shared_prompt_tokens,
)
from roll_ma.preflight.config_loader import load_config
from roll_ma.training.micro_batches import MicroBatching, real_lengths
from roll_ma.training.policy_engine import PolicyEngine

SHARED = {"remove_padding": True, "logits_chunk_tokens": 5}


@pytest.fixture
def shared_forwards(monkeypatch):
    """Counts the packed forwards that ran with shared prompts (so a test sees sharing really happen)."""
    calls = []
    original = logprobs.shared_prefix_hidden

    def counting(*args, **kwargs):
        calls.append(args[4].tolist())  # the micro-batch's groups
        return original(*args, **kwargs)

    monkeypatch.setattr(logprobs, "shared_prefix_hidden", counting)
    return calls


@pytest.fixture
def gradients(monkeypatch):
    """Every optimizer step's accumulated gradients, per policy, before the step."""
    seen: list[dict[str, torch.Tensor]] = []
    original = PolicyEngine.optimizer_step

    def recording(self):
        seen.append({f"{self.name}.{i}": p.grad.detach().clone() for i, p in enumerate(self.params)
                     if p.grad is not None})
        return original(self)

    monkeypatch.setattr(PolicyEngine, "optimizer_step", recording)
    return seen


@pytest.mark.parametrize("branch", [0, 3], ids=["one_prompt", "branching_histories"])
def test_scored_log_probs_equal_with_and_without_shared_prompts(make_strategy, shared_forwards, branch):
    """2 agents x 2 groups x 4 samples, replies of different lengths: reference (adapters off) and old
    (each agent's adapter) log-probs and entropies are the same whether each group's prompt runs once;
    and where each sample's prompt goes on with tokens of its own, whether their common prefix runs once."""
    batch = make_group_batch(seed=1, branch_tokens=branch)
    out = {}
    for share in (False, True):
        s = make_strategy(["a0", "a1"], share_prompt_prefix=share, max_tokens_per_micro_batch=4096, **SHARED)
        ref = s.compute_log_probs(batch, adapters_enabled=False).batch["ref_log_probs"]
        old = s.compute_log_probs(batch, with_entropy=True)
        out[share] = (ref, old.batch["old_log_probs"], old.batch["entropy"])
    assert shared_forwards, "the shared path never ran"
    assert all(len(set(groups)) < len(groups) for groups in shared_forwards)  # prompts were shared
    for plain, shared in zip(out[False], out[True], strict=True):
        torch.testing.assert_close(shared, plain, rtol=0, atol=1e-5)


@pytest.mark.parametrize("branch", [0, 3], ids=["one_prompt", "branching_histories"])
@pytest.mark.parametrize("budget", [4096, 24], ids=["one_micro_batch", "several_micro_batches"])
def test_update_loss_and_lora_gradients_equal_with_and_without_shared_prompts(
    make_strategy, shared_forwards, gradients, budget, branch
):
    """One PPO update (KL in the loss, entropy bonus): the loss and every LoRA weight's gradient are the
    same with each group's prompt (or, branching, the prefix its prompts share) run once, in one
    micro-batch or split over several."""
    batch = make_group_batch(seed=2, branch_tokens=branch)
    results = []
    for share in (False, True):
        gradients.clear()
        s = make_strategy(["a0", "a1"], share_prompt_prefix=share, max_tokens_per_micro_batch=budget,
                          **SHARED)
        rows = on_policy(s, batch, ref=True)
        metrics = s.train_step(rows).metrics
        results.append((metrics, list(gradients)))
    (plain_m, plain_g), (shared_m, shared_g) = results
    assert shared_forwards
    for agent in ("a0", "a1"):
        for key in ("policy_loss", "entropy", "kl", "tokens"):
            name = f"agent/{agent}/{key}"
            assert shared_m[name] == pytest.approx(plain_m[name], rel=1e-5, abs=1e-6), name
    assert len(shared_g) == len(plain_g) == 2  # one optimizer step per adapter
    for plain, shared in zip(plain_g, shared_g, strict=True):
        assert plain.keys() == shared.keys() and plain
        for name, g in plain.items():
            torch.testing.assert_close(shared[name], g, rtol=1e-4, atol=1e-6, msg=name)
    assert shared_m["train/tokens"] == plain_m["train/tokens"]
    assert plain_m["train/tokens_deduplicated"] == plain_m["train/tokens"]  # switch off: every prompt runs
    assert shared_m["train/tokens_deduplicated"] < shared_m["train/tokens"]


def test_rows_of_other_agents_or_prompts_never_share():
    same = [5, 6, 7]
    tensors = pack_sequences([same, same, same, [5, 6, 8], [6, 7]], [[9], [9, 9], [10], [11], [12]], 0)
    groups = prompt_groups(tensors["input_ids"], tensors["attention_mask"], 2, domain=[0, 0, 1, 0, 0])
    assert groups.tolist() == [0, 0, 1, 2, 3]  # agent 1's identical prompt is its own; other prompts too
    assert prompt_groups(tensors["input_ids"], tensors["attention_mask"], 2).tolist() == [0, 0, 0, 1, 2]


def test_samples_of_one_history_share_its_prefix_where_that_saves_more_than_identical_prompts():
    """Episode group a: three prompts that go on differently after [1, 2, 3, 4] (a later turn carrying each
    sample's reply) run the prefix once. Episode group b: two turns' prompts twice each ([5, 6, 7] and
    [5, 6, 8, 9]): identical prompts save 7 tokens, their 2-token common prefix 6, so they stay as they
    are. Agent 1's row of group a shares with no row of agent 0."""
    prompts = [[1, 2, 3, 4, 9], [1, 2, 3, 4, 8], [1, 2, 3, 4, 7, 7], [5, 6, 7], [5, 6, 8, 9], [5, 6, 7],
               [5, 6, 8, 9], [1, 2, 3, 4, 9]]
    t = pack_sequences(prompts, [[10]] * len(prompts), 0)
    agents, episodes = [0, 0, 0, 0, 0, 0, 0, 1], ["a", "a", "a", "b", "b", "b", "b", "a"]
    groups = prompt_groups(t["input_ids"], t["attention_mask"], 1, agents, episodes)
    assert groups.tolist() == [0, 0, 0, 1, 2, 1, 2, 3]
    shared = shared_prefix_lens(t["input_ids"], t["attention_mask"], 1, groups)
    assert shared.tolist() == [4, 4, 4, 3, 4, 3, 4, 5]
    # without episode groups only identical prompts share (as before group ids were read)
    plain = prompt_groups(t["input_ids"], t["attention_mask"], 1, agents)
    assert plain.tolist() == [0, 1, 2, 3, 4, 3, 4, 5]
    # the same two prompts in two episode groups (a small game's states repeat across games): identical
    # prompts across the groups save 2 x 4 tokens, each group's 3-token prefix 2 x 3: they stay identical
    again = pack_sequences([[1, 2, 3, 8], [1, 2, 3, 9]] * 2, [[10]] * 4, 0)
    across = prompt_groups(again["input_ids"], again["attention_mask"], 1, [0] * 4, ["a", "a", "b", "b"])
    assert across.tolist() == [0, 1, 0, 1]
    # the budget counts each group's prefix once and every row's rest; the total stays every row's tokens
    p, r = real_lengths(t["attention_mask"], 1)
    first, rest = shared_lengths(p, r, shared)
    assert (first + rest).tolist() == (p + r).tolist()
    plan = MicroBatching(max_rows=16, max_tokens=10_000, remove_padding=True, share_prefix=True)
    assert plan.cost(first, rest, groups) == int((p + r).sum()) - (2 * 4 + 3 + 4)


def test_deduplicated_token_count_and_budget():
    batch = make_group_batch(agents=2, groups=2, samples=4, seed=3)
    resp = batch.batch["responses"].shape[1]
    p, r = real_lengths(batch.batch["attention_mask"], resp)
    groups = prompt_groups(batch.batch["input_ids"], batch.batch["attention_mask"], resp,
                           [int(a) for a in batch.non_tensor["agent_id"]])
    assert len(set(groups.tolist())) == 4 and np.bincount(groups).tolist() == [4] * 4
    first = [int(np.nonzero(groups == g)[0][0]) for g in range(4)]
    plan = MicroBatching(max_rows=16, max_tokens=10_000, remove_padding=True, share_prefix=True)
    rows = np.arange(len(groups))
    assert plan.cost(p, r, groups) == int(r.sum() + p[first].sum())  # each group's prompt once
    assert plan.cost(p, r) == int(p.sum() + r.sum())  # groups unknown: every prompt
    assert MicroBatching(16, 10_000, True).cost(p, r, groups) == int(p.sum() + r.sum())  # switch off
    # a budget too small for a whole group: the group in pieces, each within budget and carrying its prompt
    tight = MicroBatching(max_rows=16, max_tokens=int(p.max() + 2 * r.max()), remove_padding=True,
                          share_prefix=True)
    for world in (1, 2):
        plans = [tight.rank_plan(rows, p, r, k, world, groups) for k in range(world)]
        seen = np.concatenate([m for plan_k in plans for m in plan_k])
        assert sorted(seen.tolist()) == rows.tolist()
        assert all(tight.cost(p[m], r[m], groups[m]) <= tight.max_tokens for plan_k in plans for m in plan_k)


def test_sharing_needs_packed_rows():
    with pytest.raises(ConfigError) as err:
        load_config("math_selfplay_tiny", overrides=["train.share_prompt_prefix=true"])
    problems = [str(p) for p in err.value.problems]
    assert len(problems) == 1 and "train.share_prompt_prefix" in problems[0]
    assert "set train.remove_padding=true" in problems[0]
    cfg = load_config("math_selfplay_tiny",
                      overrides=["train.share_prompt_prefix=true", "train.remove_padding=true"])
    assert MicroBatching.for_training(cfg.train).share_prefix
    assert MicroBatching.for_scoring(cfg.train).share_prefix


def test_sharing_is_on_by_default_wherever_rows_are_packed():
    assert TrainConfig().share_prompt_prefix == "auto"
    assert not MicroBatching.for_scoring(TrainConfig()).share_prefix  # padded rows: nothing to share
    packed = TrainConfig(remove_padding=True)
    for attention in (None, "roll_ma_varlen"):
        assert prompt_sharing(packed, attention)
    off = dataclasses.replace(packed, share_prompt_prefix=False)
    assert not prompt_sharing(off, None)
    assert prompt_sharing_note(off, "sdpa") is None and prompt_sharing_note(TrainConfig(), "sdpa") is None
    # another attention cannot share: auto runs it off, with one line saying so; true is refused
    assert not prompt_sharing(packed, "sdpa")
    note = prompt_sharing_note(packed, "sdpa")
    assert note is not None and "\n" not in note
    assert "train.share_prompt_prefix=auto: off, model.attn_implementation=sdpa" in note
    sdpa = ["train.remove_padding=true", "model.attn_implementation=sdpa"]
    assert load_config("math_selfplay_tiny", overrides=sdpa).train.share_prompt_prefix == "auto"
    with pytest.raises(ConfigError, match="needs the default attention"):
        load_config("math_selfplay_tiny", overrides=[*sdpa, "train.share_prompt_prefix=true"])


def test_the_workers_run_what_the_run_plan_decided_and_refuse_auto_undecided(make_strategy):
    """The run plan decides auto once (by the model's attention); the workers' batching reads its choice,
    and a trainer or batching handed auto with packed rows refuses it (it would decide again)."""
    packed = TrainConfig(remove_padding=True)
    for attention, shared in ((None, True), ("sdpa", False)):
        cfg = RunConfig(train=packed, model=ModelConfig(attn_implementation=attention))
        plan = run_plan(cfg)
        assert plan.shares_prompts is shared
        worker_train = plan.worker_train_config(cfg.train)
        assert worker_train.share_prompt_prefix is shared
        assert MicroBatching.for_training(worker_train).share_prefix is shared
        assert MicroBatching.for_scoring(worker_train).share_prefix is shared
        s = make_strategy(["a0", "a1"], remove_padding=True, share_prompt_prefix=shared,
                          model={"attn_implementation": attention})
        assert s.updaters["a0"].batching.share_prefix is shared
    with pytest.raises(ValueError, match="share_prompt_prefix=auto reaches a worker undecided"):
        MicroBatching.for_training(packed)
    with pytest.raises(ValueError, match="share_prompt_prefix=auto reaches the trainer undecided"):
        make_strategy(["a0"], remove_padding=True, share_prompt_prefix="auto")


def test_large_groups_fill_the_budget_in_pieces():
    """8 groups x 8 replies of 256 tokens to 136-token prompts (2184 tokens a group): a 4096 budget
    holds one group whole, so groups over half the budget fill the room left in pieces; an 8192 budget
    keeps every group whole."""
    p, r = np.full(64, 136), np.full(64, 256)
    groups, rows = np.repeat(np.arange(8), 8), np.arange(64)
    for budget, micro_batches, tokens in ((4096, 5, 17880), (8192, 3, 8 * 136 + 64 * 256)):
        plan = MicroBatching(max_rows=64, max_tokens=budget, remove_padding=True, share_prefix=True)
        split = plan.split(rows, p, r, groups)
        assert sorted(np.concatenate(split).tolist()) == rows.tolist()
        assert len(split) == micro_batches and all(plan.cost(p[m], r[m], groups[m]) <= budget for m in split)
        assert sum(plan.cost(p[m], r[m], groups[m]) for m in split) == tokens
    plain = MicroBatching(max_rows=64, max_tokens=4096, remove_padding=True)
    assert len(plain.split(rows, p, r)) == 7 and len(plain.split(rows, p, r, groups)) == 7  # switch off


def test_branching_groups_never_save_fewer_tokens_than_identical_prompts():
    """Random batches of short prompts over a few shared starts, two agents, three episode groups: the
    grouping with episode groups runs no more prompt tokens than identical prompts alone would."""
    rng = np.random.default_rng(0)
    for _ in range(300):
        n = int(rng.integers(2, 14))
        starts = [rng.integers(3, 6, rng.integers(0, 4)).tolist() for _ in range(3)]
        prompts = [starts[int(rng.integers(3))] + rng.integers(3, 5, rng.integers(1, 3)).tolist()
                   for _ in range(n)]
        t = pack_sequences(prompts, [[9]] * n, 0)
        agents, episodes = rng.integers(0, 2, n).tolist(), rng.integers(0, 3, n).tolist()
        saved = []
        for groups in (prompt_groups(t["input_ids"], t["attention_mask"], 1, agents),
                       prompt_groups(t["input_ids"], t["attention_mask"], 1, agents, episodes)):
            shared = shared_prefix_lens(t["input_ids"], t["attention_mask"], 1, groups)
            saved.append(shared_prompt_tokens(shared, groups))
        assert saved[1] >= saved[0]
