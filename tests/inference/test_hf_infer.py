"""HFInferStrategy: mixed-adapter batches, seeded sampling, stop strings, log-probs, adapter updates."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from rollout_helpers import GREEDY, TEXTS, make_request, responses_of, rollout_cfg

from roll_ma.inference.hf_infer import HFInferStrategy
from roll_ma.models.logprobs import response_log_probs
from roll_ma.protocol.requests import GenerateRequest

AGENT_IDS = [0, 1, 2, 1, 0, 1]


@pytest.fixture(scope="module")
def hf(rollout_model_cfg, agent_plan, make_adapter_tensors):
    agents, adapters = agent_plan
    strategy = HFInferStrategy(rollout_model_cfg, rollout_cfg(), agents, adapters, seed=0, device="cpu")
    strategy.initialize()
    strategy.update_adapters(make_adapter_tensors(1), version=1)
    return strategy


def test_initial_versions_are_zero(rollout_model_cfg, agent_plan):
    agents, adapters = agent_plan
    strategy = HFInferStrategy(rollout_model_cfg, rollout_cfg(), agents, adapters, seed=0, device="cpu")
    strategy.initialize()
    assert strategy.adapter_versions() == {"a0": 0, "a1": 0}


def test_mixed_adapter_batch_equals_single_adapter_runs(hf, tokenizer):
    mixed = hf.generate(make_request(tokenizer, TEXTS, AGENT_IDS), GREEDY)
    assert mixed.non_tensor["tag"].tolist() == [f"row{i}" for i in range(len(TEXTS))]  # pass-through column
    got = responses_of(mixed)
    for agent in (0, 1, 2):
        rows = [i for i, a in enumerate(AGENT_IDS) if a == agent]
        request = make_request(tokenizer, [TEXTS[i] for i in rows], [agent] * len(rows))
        alone = hf.generate(request, GREEDY)
        assert responses_of(alone) == [got[i] for i in rows]
    # the adapters matter: a0 and a1 answer the same prompt differently
    a0 = responses_of(hf.generate(make_request(tokenizer, TEXTS, [0] * len(TEXTS)), GREEDY))
    a1 = responses_of(hf.generate(make_request(tokenizer, TEXTS, [1] * len(TEXTS)), GREEDY))
    assert sum(x != y for x, y in zip(a0, a1, strict=True)) >= len(TEXTS) - 1


def test_packed_layout(hf, tokenizer):
    out = hf.generate(make_request(tokenizer, TEXTS, AGENT_IDS), GREEDY)
    b, p = out.batch["prompts"].shape
    r = out.batch["responses"].shape[1]
    assert out.batch["input_ids"].shape == (b, p + r)
    assert torch.equal(out.batch["input_ids"], torch.cat([out.batch["prompts"], out.batch["responses"]], 1))
    assert torch.equal(out.batch["attention_mask"][:, p:].float(), out.batch["response_mask"])
    assert (out.batch["rollout_log_probs"][out.batch["response_mask"] == 0] == 0).all()
    assert r == max(len(x) for x in responses_of(out))  # R is this call's longest response
    for row, toks in enumerate(responses_of(out)):
        finish = out.non_tensor["finish_reason"][row]
        assert finish == ("stop" if toks[-1] == tokenizer.eos_token_id else "length")
        assert out.non_tensor["response_text"][row] == tokenizer.decode(toks, skip_special_tokens=True)


def test_seeded_sampling_is_reproducible_and_split_independent(hf, tokenizer):
    meta = GenerateRequest(seed=11, temperature=1.0)
    seeds = list(range(100, 100 + len(TEXTS)))
    whole = responses_of(hf.generate(make_request(tokenizer, TEXTS, AGENT_IDS, seeds), meta))
    again = responses_of(hf.generate(make_request(tokenizer, TEXTS, AGENT_IDS, seeds), meta))
    assert whole == again
    # the same rows split over two calls (two rollout workers) sample the same tokens
    first = responses_of(hf.generate(make_request(tokenizer, TEXTS[:2], AGENT_IDS[:2], seeds[:2]), meta))
    rest = responses_of(hf.generate(make_request(tokenizer, TEXTS[2:], AGENT_IDS[2:], seeds[2:]), meta))
    assert first + rest == whole
    reseeded = replace(meta, seed=12)
    other = responses_of(hf.generate(make_request(tokenizer, TEXTS, AGENT_IDS, seeds), reseeded))
    assert other != whole
    # rows with the same prompt but different sample seeds (a GRPO group) differ
    group = responses_of(hf.generate(make_request(tokenizer, [TEXTS[0]] * 4, [0] * 4, [1, 2, 3, 4]), meta))
    assert len({tuple(g) for g in group}) > 1


def test_stop_string_cuts_text_and_mask(hf, tokenizer):
    request = make_request(tokenizer, TEXTS, AGENT_IDS)
    plain = hf.generate(request, GREEDY)
    row = max(range(len(TEXTS)), key=lambda i: len(plain.non_tensor["response_text"][i]))
    text = plain.non_tensor["response_text"][row]
    assert len(text) >= 6, "the tiny model should produce some text"
    stop = text[3:5]
    cut_at = text.find(stop)
    out = hf.generate(make_request(tokenizer, TEXTS, AGENT_IDS), GenerateRequest(greedy=True, stop=(stop,)))
    assert out.non_tensor["response_text"][row] == text[:cut_at]
    assert out.non_tensor["finish_reason"][row] == "stop"
    toks, full = responses_of(out)[row], responses_of(plain)[row]
    assert toks == full[: len(toks)] and len(toks) < len(full)
    # the last token completes the stop string
    assert stop in tokenizer.decode(toks) and stop not in tokenizer.decode(toks[:-1])


def test_max_new_tokens_respected(hf, tokenizer):
    out = hf.generate(make_request(tokenizer, TEXTS, AGENT_IDS), replace(GREEDY, max_new_tokens=3))
    assert out.batch["responses"].shape[1] <= 3
    for row, toks in enumerate(responses_of(out)):
        assert 1 <= len(toks) <= 3
        if toks[-1] != tokenizer.eos_token_id:
            assert len(toks) == 3 and out.non_tensor["finish_reason"][row] == "length"


@pytest.mark.parametrize(
    "meta,temperature", [(GenerateRequest(temperature=0.7, seed=3), 0.7), (GREEDY, 1.0)]
)
def test_rollout_log_probs_equal_a_direct_forward(hf, tokenizer, agent_plan, meta, temperature):
    agents, _ = agent_plan
    out = hf.generate(make_request(tokenizer, TEXTS, AGENT_IDS, list(range(len(TEXTS)))), meta)
    names = [agents[a].adapter for a in AGENT_IDS]
    with torch.no_grad():
        ref, _ = response_log_probs(
            hf.model,
            out.batch["input_ids"],
            out.batch["attention_mask"],
            out.batch["responses"].shape[1],
            temperature=temperature,
            adapter_names=names,
        )
    mask = out.batch["response_mask"]
    # generate's KV-cached decode vs one full forward: the same math, different float rounding
    torch.testing.assert_close(out.batch["rollout_log_probs"], ref * mask, atol=5e-5, rtol=0)
    assert (out.batch["rollout_log_probs"][mask.bool()] < 0).all()


def test_update_adapters_changes_scores_and_versions(hf, tokenizer, make_adapter_tensors):
    batch = hf.generate(make_request(tokenizer, TEXTS, AGENT_IDS), GREEDY)
    assert set(batch.non_tensor["adapter_version"].tolist()) == {1}
    before = hf.score(batch).batch["rollout_log_probs"]
    # generate's KV-cached decode vs score's full forward: the same math, different float rounding
    torch.testing.assert_close(before, batch.batch["rollout_log_probs"], atol=5e-5, rtol=0)
    new = make_adapter_tensors(2)
    timings = hf.update_adapters({"a1": new["a1"]}, version=5)
    assert set(timings) == {"a1"} and timings["a1"] >= 0
    assert hf.adapter_versions() == {"a0": 1, "a1": 5}
    scored = hf.score(batch)
    after = scored.batch["rollout_log_probs"]
    a1_rows = torch.tensor([a == 1 for a in AGENT_IDS])
    assert torch.equal(after[~a1_rows], before[~a1_rows])  # a0 rows (agents 0 and 2) untouched
    assert (after[a1_rows] - before[a1_rows]).abs().max() > 1e-2
    assert scored.non_tensor["score_adapter_version"].tolist() == [5 if a == 1 else 1 for a in AGENT_IDS]
    out = hf.generate(make_request(tokenizer, TEXTS, AGENT_IDS), GREEDY)
    assert out.non_tensor["adapter_version"].tolist() == [5 if a == 1 else 1 for a in AGENT_IDS]
    hf.update_adapters(
        make_adapter_tensors(1), version=6
    )  # the module's other tests expect the seed-1 weights
    assert hf.adapter_versions() == {"a0": 6, "a1": 6}


def test_bad_requests_raise(hf, tokenizer):
    with pytest.raises(ValueError, match="agent_id 7"):
        hf.generate(make_request(tokenizer, TEXTS[:1], [7]), GenerateRequest())
    with pytest.raises(ValueError, match="top_p"):
        hf.generate(make_request(tokenizer, TEXTS[:1], [0]), GenerateRequest(top_p=0.0))
    with pytest.raises(ValueError, match="unknown adapters"):
        hf.update_adapters({"nope": {}}, version=1)
    with pytest.raises(ValueError, match="level 2"):
        hf.sleep(level=2)


def test_tiny_top_p_samples_the_argmax(hf, tokenizer):
    greedy = responses_of(hf.generate(make_request(tokenizer, TEXTS, AGENT_IDS), GREEDY))
    meta = GenerateRequest(temperature=1.0, top_p=1e-6, seed=1)
    assert responses_of(hf.generate(make_request(tokenizer, TEXTS, AGENT_IDS), meta)) == greedy
