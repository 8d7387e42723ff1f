"""Log-probs whose memory follows tokens: the split LM head (chunked, checkpointed), packed rows
without padding, and token-budget micro-batches give the same numbers and gradients as the plain
full-logits path and as row micro-batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from train_helpers import LORA, make_batch, on_policy, snapshot

from roll_ma.config.schema import ModelConfig, TrainConfig
from roll_ma.models.adapters import AdapterSpec, inject_adapters
from roll_ma.models.loading import load_base_model
from roll_ma.models.logprobs import _full_logits_log_probs, response_log_probs, split_lm
from roll_ma.training.micro_batches import MicroBatching, real_lengths


@pytest.fixture()
def lora_model(tiny_model_dir):
    """The tiny Qwen2 with one LoRA adapter whose B is nonzero (so LoRA changes the logits)."""
    spec = AdapterSpec("a0", LORA.rank, LORA.alpha, 0.0, tuple(LORA.target_modules))
    model = inject_adapters(load_base_model(ModelConfig(path=tiny_model_dir)), [spec], seed=0)
    model.set_adapter("a0")
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def _plain(model, ids, attn, resp_len, temperature):
    """The reference: whole (B, T, V) logits of the full model, trimmed like response_log_probs."""
    return _full_logits_log_probs(model, ids, attn, resp_len, temperature, with_entropy=True)


def _lora_grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("remove_padding", [False, True])
@pytest.mark.parametrize("chunk_tokens", [0, 3])
def test_split_head_equals_full_logits_values_and_gradients(lora_model, remove_padding, chunk_tokens):
    batch = make_batch([0] * 5, seed=1, prompt_len=7, response_len=6)
    ids, attn = batch.batch["input_ids"], batch.batch["attention_mask"]  # (5, 13) each
    resp = attn[:, -6:].float()  # (5, 6)
    assert split_lm(lora_model) is not None  # the tiny Qwen2 takes the split path
    lora_model.train()  # dropout is 0: train mode only makes gradients flow as in the update

    want_lp, want_ent = _plain(lora_model, ids, attn, 6, temperature=0.7)
    (want_lp * resp).sum().add((want_ent * resp).sum() * 0.1).backward()
    want_grads = _lora_grads(lora_model)
    lora_model.zero_grad(set_to_none=True)

    lp, ent = response_log_probs(
        lora_model,
        ids,
        attn,
        6,
        temperature=0.7,
        with_entropy=True,
        remove_padding=remove_padding,
        chunk_tokens=chunk_tokens,
    )  # (5, 6) each
    (lp * resp).sum().add((ent * resp).sum() * 0.1).backward()
    grads = _lora_grads(lora_model)

    torch.testing.assert_close(lp, want_lp * resp, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ent, want_ent * resp, rtol=1e-4, atol=1e-5)
    assert (lp[resp == 0] == 0).all()  # nothing off the response
    assert want_grads.keys() == grads.keys() and len(grads) > 0
    for name, g in want_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-3, atol=1e-6, msg=name)


def test_packed_rows_do_not_see_each_other(lora_model):
    """A row's log-probs do not change when other rows are packed next to it."""
    batch = make_batch([0] * 4, seed=2, prompt_len=6, response_len=5)
    ids, attn = batch.batch["input_ids"], batch.batch["attention_mask"]
    with torch.no_grad():
        together, _ = response_log_probs(lora_model, ids, attn, 5, remove_padding=True)
        alone = torch.cat(
            [
                response_log_probs(lora_model, ids[i : i + 1], attn[i : i + 1], 5, remove_padding=True)[0]
                for i in range(4)
            ]
        )
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-5)


def test_token_budget_plan_covers_rows_once_within_budget():
    rng = np.random.default_rng(0)
    prompt_lens, response_lens = rng.integers(1, 60, 40), rng.integers(1, 200, 40)  # (40,) each
    rows = np.arange(40)
    for remove_padding in (False, True):
        plan = MicroBatching(max_rows=4, max_tokens=512, remove_padding=remove_padding)
        bins = plan.split(rows, prompt_lens, response_lens)
        assert sorted(np.concatenate(bins).tolist()) == rows.tolist()
        for b in bins:
            assert len(b) == 1 or plan.cost(prompt_lens[b], response_lens[b]) <= 512
        # three ranks: same number of micro-batches each, together every row once
        per_rank = [plan.rank_plan(rows, prompt_lens, response_lens, r, 3) for r in range(3)]
        assert len({len(p) for p in per_rank}) == 1
        assert sorted(np.concatenate([b for p in per_rank for b in p]).tolist()) == rows.tolist()
    # a row longer than the budget runs alone, not nowhere
    big = MicroBatching(max_rows=4, max_tokens=10).split(np.arange(2), np.array([20, 2]), np.array([5, 2]))
    assert sorted(len(b) for b in big) == [1, 1]


def test_token_budget_ranks_get_even_tokens_and_as_many_micro_batches():
    """Two ranks split an agent's rows by tokens before packing: each runs about half the tokens (the old
    deal of whole micro-batches gave one rank 3 of 5 when their number was odd)."""
    prompt_lens = np.full(128, 100)
    response_lens = np.full(128, 512)  # 128 rows x 612 tokens: 3 micro-batches of 16k on one rank
    plan = MicroBatching(max_rows=16, max_tokens=16384, remove_padding=True)
    rows = np.arange(128)
    one = plan.rank_plan(rows, prompt_lens, response_lens, 0, 1)
    two = [plan.rank_plan(rows, prompt_lens, response_lens, r, 2) for r in (0, 1)]
    assert len(one) == 5 and len(two[0]) == len(two[1]) == 3
    tokens = [sum(int((prompt_lens[b] + response_lens[b]).sum()) for b in mine) for mine in two]
    assert tokens == [64 * 612, 64 * 612]
    assert sorted(np.concatenate(two[0] + two[1]).tolist()) == rows.tolist()  # every row once


def test_rows_without_budget_split_as_before():
    plan = MicroBatching(max_rows=2)
    lens = np.ones(5, dtype=np.int64)
    per_rank = [plan.rank_plan(np.arange(5), lens, lens, r, 2) for r in range(2)]
    assert [b.tolist() for b in per_rank[0]] == [[0, 1], [2]]
    assert [b.tolist() for b in per_rank[1]] == [[3, 4], []]  # the short rank runs an empty micro-batch


def test_real_lengths():
    attn = np.array([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0]])
    p, r = real_lengths(attn, 3)
    assert p.tolist() == [2, 3] and r.tolist() == [2, 1]


@pytest.mark.parametrize("remove_padding", [False, True])
def test_token_budget_update_equals_row_update(make_strategy, remove_padding):
    """The same rows trained with a token budget (and packed) move the adapter as row micro-batches do:
    the loss is normalised by the mini-batch's tokens, however the rows are grouped."""
    batch = make_batch([0, 1, 0, 1, 0, 1, 0, 1], seed=4, prompt_len=8, response_len=6)
    results = []
    for kwargs in (
        {"micro_batch_size": 3},
        {"max_tokens_per_micro_batch": 30, "remove_padding": remove_padding, "logits_chunk_tokens": 4},
    ):
        s = make_strategy(["a0", "a1"], **kwargs)
        rows = on_policy(s, batch)
        snapshot_before = snapshot(s)
        metrics = s.train_step(rows).metrics
        moments = {a: s.optimizer_state(a)["exp_avg"] for a in ("a0", "a1")}
        results.append((snapshot(s), moments, metrics, rows.batch["old_log_probs"]))
    (w_rows, g_rows, m_rows, old_rows), (w_tok, g_tok, m_tok, old_tok) = results
    torch.testing.assert_close(old_tok, old_rows, rtol=1e-4, atol=1e-5)
    # After one step Adam's first moment is (1 - beta1) x the clipped gradient: compare that. The weights
    # moved by lr x g / (|g| + eps), which flips by up to 2 lr where g is near zero and summed in another
    # order, so they are compared only at the size of a step.
    for adapter in g_rows:
        assert len(g_rows[adapter]) == len(g_tok[adapter]) > 0
        for tok, row in zip(g_tok[adapter], g_rows[adapter], strict=True):
            torch.testing.assert_close(tok, row, rtol=1e-4, atol=1e-6 * float(row.abs().max()))
        for k in w_rows[adapter]:
            torch.testing.assert_close(w_tok[adapter][k], w_rows[adapter][k], rtol=0, atol=2.5e-2)
        assert any(not torch.equal(w_tok[adapter][k], snapshot_before[adapter][k]) for k in w_tok[adapter])
    for k in ("agent/a0/policy_loss", "agent/a1/entropy", "agent/a0/tokens"):
        assert m_tok[k] == pytest.approx(m_rows[k], rel=1e-4, abs=1e-6)


def test_budget_keys_are_in_the_schema():
    cfg = TrainConfig(
        max_tokens_per_micro_batch=4096, score_max_tokens_per_micro_batch=16384, remove_padding=True,
        share_prompt_prefix=False,
    )
    assert MicroBatching.for_training(cfg).max_tokens == 4096
    assert MicroBatching.for_scoring(cfg).max_tokens == 16384
    assert MicroBatching.for_scoring(TrainConfig(max_tokens_per_micro_batch=99)).max_tokens == 99


def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_dir):
    """The 7B configs turn gradient checkpointing on: through the split head and packed rows it must
    recompute, not change, the gradients."""
    batch = make_batch([0] * 4, seed=5, prompt_len=6, response_len=5)
    ids, attn = batch.batch["input_ids"], batch.batch["attention_mask"]
    resp = attn[:, -5:].float()
    grads = []
    for checkpointing in (False, True):
        spec = AdapterSpec("a0", LORA.rank, LORA.alpha, 0.0, tuple(LORA.target_modules))
        cfg = ModelConfig(path=tiny_model_dir, gradient_checkpointing=checkpointing)
        model = inject_adapters(load_base_model(cfg), [spec], seed=0)
        model.set_adapter("a0")
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.fill_(0.01)
        model.train()
        assert model.get_base_model().model.gradient_checkpointing == checkpointing
        lp, _ = response_log_probs(model, ids, attn, 5, remove_padding=True, chunk_tokens=2)
        (lp * resp).sum().backward()
        grads.append(_lora_grads(model))
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 0
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-7, msg=name)
