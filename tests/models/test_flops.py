"""Model FLOPs and MFU (roll_ma/models/flops.py, roll_ma/metrics.py), with the arithmetic written out."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from roll_ma.config.schema import AgentConfig, RunConfig
from roll_ma.metrics import forward_flops_of, mfu_metrics, update_mfu_metrics
from roll_ma.models.flops import ModelShape, forward_flops, peak_flops
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import UpdateResult

QWEN25_7B = SimpleNamespace(num_hidden_layers=28, hidden_size=3584, num_attention_heads=28,
                            num_key_value_heads=4, intermediate_size=18944, vocab_size=152064)
TINY = ModelShape(layers=2, hidden=4, heads=2, kv_heads=1, head_dim=2, intermediate=8, vocab=10)


def test_the_7b_decoder_has_its_published_non_embedding_weights():
    shape = ModelShape.of(QWEN25_7B)
    assert (shape.head_dim, shape.kv_heads) == (128, 4)
    # per layer: q, o 2 * 3584^2 = 25,690,112; k, v 2 * 3584 * 512 = 3,670,016; MLP 3 * 3584 * 18944
    # = 203,685,888; x 28 layers = 6,525,288,448 (Qwen2.5-7B's model card: 6.53B non-embedding)
    assert shape.linear_params == 6_525_288_448


def test_forward_flops_by_hand():
    # TINY: linear weights per layer 2*4*4 + 2*4*2 + 3*4*8 = 32 + 16 + 96 = 144, x2 layers = 288
    assert TINY.linear_params == 288
    # rows of 3 and 2 tokens, 2 and 1 of them response tokens:
    #   linear 2 * 288 * 5 = 2880; attention 2 * 2 layers * (2 heads * 2) * (3*4 + 2*3) = 16 * 18 = 288;
    #   head 2 * 4 * 10 * 3 = 240
    assert forward_flops(TINY, np.array([3, 2]), np.array([2, 1])) == 2880 + 288 + 240


def _rows(agent_ids: list[int]) -> DataProto:
    # prompt 1 token + response 2 tokens each: 3 real tokens a row, 2 of them response
    n = len(agent_ids)
    tensors = {"attention_mask": torch.ones(n, 3, dtype=torch.long), "response_mask": torch.ones(n, 2)}
    return DataProto.from_dict(tensors, {"agent_id": agent_ids})


def test_mfu_is_model_flops_over_seconds_per_gpu_over_peak():
    out = mfu_metrics({"reference": 8e12, "update": 0.0, "values": 4e12}, {"reference": 2.0, "values": 0.0},
                      {"reference": 2}, peak_flops=1e12)
    assert out == {"system/tflops_per_gpu/reference": 2.0, "system/mfu/reference": 2.0}
    assert "system/mfu/reference" not in mfu_metrics({"reference": 8e12}, {"reference": 2.0}, {}, 0.0)


def test_update_mfu_counts_two_forwards_of_the_agents_that_stepped():
    cfg = RunConfig(agents=[AgentConfig(name="a"), AgentConfig(name="b")])
    rows = _rows([0, 1, 1])
    one_row = forward_flops(TINY, np.array([3]), np.array([2]))
    assert forward_flops_of(rows, TINY) == 3 * one_row
    # which agents stepped is the update's typed answer (no metric name is read for it)
    metrics = UpdateResult({"timing/value_critic_update": 1.0}, stepped_agents=(0,), updated_adapters=("a",))
    out = update_mfu_metrics(cfg, rows, metrics, {"timing/update": 3.0}, TINY, {"update": 1}, peak_flops=1.0)
    # a's row only (b took no step), over 3 s less the critic's own 1 s
    assert out["system/mfu/update"] == pytest.approx(2 * one_row / 2.0)
    full = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, full_finetune=True))
    out = update_mfu_metrics(full, rows, metrics, {"timing/update": 3.0}, TINY, {"update": 1}, peak_flops=1.0)
    assert out["system/mfu/update"] == pytest.approx(3 * one_row / 2.0)


def test_shared_prompts_count_each_groups_prompt_once():
    """Agent 0 answers prompt [5, 6] three times (replies of 1, 2, 2 tokens) and [7] once; agent 1 answers
    [5, 6] once (another adapter: its own group). Run once, a group's prompt costs its linear work and its
    own attention once; each reply still attends to the whole prompt."""
    from roll_ma.packing import pack_sequences

    prompts = [[5, 6], [5, 6], [5, 6], [7], [5, 6]]
    replies = [[1], [1, 2], [3, 4], [1, 1], [2]]
    tensors = pack_sequences(prompts, replies, 0)
    rows = DataProto.from_dict({k: tensors[k] for k in ("input_ids", "attention_mask", "response_mask")},
                               {"agent_id": [0, 0, 0, 0, 1]})
    plain = forward_flops_of(rows, TINY)
    assert plain == forward_flops(TINY, np.array([3, 4, 4, 3, 3]), np.array([1, 2, 2, 2, 1]))
    # by hand: linear 2 * 288 per token run; attention 2 * 2 layers * 4 per (query, key) pair unit, a
    # prompt of P alone P(P+1), a reply of R after it R(2P+R+1); head 2 * 4 * 10 per response token
    tokens_run = (2 + 1 + 2 + 2) + (1 + 2) + (2 + 1)
    pairs = (2 * 3 + 1 * 6 + 2 * 7 + 2 * 7) + (1 * 2 + 2 * 5) + (2 * 3 + 1 * 6)
    by_hand = 2 * 288 * tokens_run + 16 * pairs + 80 * 8
    assert forward_flops_of(rows, TINY, shared_prompts=True) == by_hand
    assert plain - by_hand == 2 * forward_flops(TINY, np.array([2]), np.array([0]))  # two repeats of [5, 6]
    only_first = np.array([True, True, False, False, False])  # the rows a pass ran: one repeat there
    assert forward_flops_of(rows, TINY, only_first, shared_prompts=True) == (
        forward_flops_of(rows, TINY, only_first) - forward_flops(TINY, np.array([2]), np.array([0])))
    cfg = RunConfig(agents=[AgentConfig(name="a"), AgentConfig(name="b")])
    stepped = UpdateResult({}, stepped_agents=(0, 1), updated_adapters=("a", "b"))
    shared = update_mfu_metrics(cfg, rows, stepped, {"timing/update": 1.0}, TINY, {"update": 1}, 1.0, True)
    assert shared["system/mfu/update"] == pytest.approx(2 * by_hand)


def test_samples_of_one_history_count_their_common_prefix_once():
    """Agent 0's episode group g: prompts [5, 6, 1] and [5, 6, 2, 2] branch after [5, 6]: that prefix runs
    once, each row's own prompt tokens and reply still run (and attend to the prefix)."""
    from roll_ma.packing import pack_sequences

    tensors = pack_sequences([[5, 6, 1], [5, 6, 2, 2]], [[1], [2, 3]], 0)
    rows = DataProto.from_dict({k: tensors[k] for k in ("input_ids", "attention_mask", "response_mask")},
                               {"agent_id": [0, 0], "group_id": ["g", "g"]})
    plain = forward_flops_of(rows, TINY)
    assert plain - forward_flops_of(rows, TINY, shared_prompts=True) == forward_flops(
        TINY, np.array([2]), np.array([0]))  # the second row's copy of [5, 6]


def test_peak_by_device_name(monkeypatch):
    monkeypatch.delenv("ROLL_MA_PEAK_TFLOPS", raising=False)
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12
    assert peak_flops("NVIDIA H100 PCIe") == 756.0e12
    assert peak_flops("NVIDIA A100-SXM4-80GB") == 312.0e12
    assert peak_flops("Some Future GPU") is None
    monkeypatch.setenv("ROLL_MA_PEAK_TFLOPS", "500")
    assert peak_flops("Some Future GPU") == 500e12
