"""Freshness and hf-vs-vllm on a GPU: a random Qwen2.5-0.5B-shaped model in bf16, three agents.

After a train step and a sync, vLLM's and HF's scores of a fixed prompt + response follow the
trainer's to within bf16 noise, and move with it; a skipped sync is caught; greedy outputs of
HF and vLLM agree token by token where the logits are not near-ties. Run on a GPU host:
``pytest -m gpu tests/training/test_freshness_gpu.py -s`` (prints the measured gaps).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from train_helpers import LORA, make_batch, on_policy

from roll_ma.config.schema import AgentConfig, ModelConfig, RolloutConfig
from roll_ma.inference import infer_strategy_class
from roll_ma.models.adapters import plan_adapters
from roll_ma.protocol.requests import UpdateRequest

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or os.environ.get("DS_ACCELERATOR") == "cpu",
        reason="needs CUDA and DS_ACCELERATOR unset or cuda",
    ),
]
AGENTS = ["solver", "critic", "refiner"]


def _mean_gap(a, b, mask) -> float:
    return float(((a.float() - b.float()).abs() * mask).sum() / mask.sum())


@pytest.fixture(scope="module")
def qwen05b_dir(tmp_path_factory):
    from roll_ma.models.tiny import build_tiny_model

    # initializer_range 0.05: logits far from flat, so a step moves log-probs well above bf16 noise
    return build_tiny_model(
        tmp_path_factory.mktemp("q05b"),
        shape="qwen2.5-0.5b",
        vocab_size=151936,
        dtype="bfloat16",
        initializer_range=0.05,
    )


def test_rollout_follows_the_trainer_on_gpu(qwen05b_dir):
    from roll_ma.config.schema import AlgorithmConfig, TrainConfig
    from roll_ma.training import train_strategy_class

    agent_specs, adapter_specs = plan_adapters(LORA, [AgentConfig(name=a) for a in AGENTS])
    model_cfg = ModelConfig(path=qwen05b_dir, dtype="bfloat16")
    trainer = train_strategy_class("multi_agent_deepspeed")(
        model_cfg, agent_specs, adapter_specs, TrainConfig(lr=2e-2), AlgorithmConfig(), seed=0
    )
    trainer.initialize()
    rcfg = RolloutConfig(enforce_eager=True, gpu_memory_utilization=0.3, max_new_tokens=16, temperature=0.0)
    vllm = infer_strategy_class("vllm")(model_cfg, rcfg, agent_specs, adapter_specs, 0, "cuda")
    hf = infer_strategy_class("hf")(model_cfg, rcfg, agent_specs, adapter_specs, 0, "cuda")
    vllm.initialize()
    hf.initialize()
    report = {}
    try:
        for engine in (vllm, hf):
            engine.update_adapters(trainer.adapter_tensors(), version=0)
        probe = make_batch([0, 1, 2] * 4, seed=7, prompt_len=48, response_len=32)  # fixed prompt + response
        mask = probe.batch["response_mask"]
        before = trainer.compute_log_probs(probe).batch["old_log_probs"]
        noise = {
            n: _mean_gap(e.score(probe).batch["rollout_log_probs"], before, mask)
            for n, e in (("vllm", vllm), ("hf", hf))
        }

        for step in (1, 2, 3):
            trainer.train_step(
                on_policy(trainer, make_batch([0, 1, 2] * 8, seed=step, prompt_len=48, response_len=32)),
                UpdateRequest(step=step),
            )
        after = trainer.compute_log_probs(probe).batch["old_log_probs"]
        moved = [_mean_gap(after[i::3], before[i::3], mask[i::3]) for i in range(3)]
        stale = _mean_gap(vllm.score(probe).batch["rollout_log_probs"], after, mask)
        for engine in (vllm, hf):
            engine.update_adapters(trainer.adapter_tensors(), version=1)
        fresh = {
            n: [
                _mean_gap(e.score(probe).batch["rollout_log_probs"][i::3], after[i::3], mask[i::3])
                for i in range(3)
            ]
            for n, e in (("vllm", vllm), ("hf", hf))
        }
        report = {
            "noise_before_step": noise,
            "moved_per_agent": moved,
            "stale_gap": stale,
            "fresh_gap": fresh,
        }

        # greedy hf vs vllm on the same prompts and adapters: compare the first generated tokens
        texts = [{"prompt_ids": list(range(10 + i, 40 + i)), "agent_id": i % 3} for i in range(6)]
        from roll_ma.protocol import DataProto
        from roll_ma.protocol.requests import GenerateRequest

        req = DataProto.from_dict(
            non_tensors={
                "prompt_ids": [t["prompt_ids"] for t in texts],
                "agent_id": [t["agent_id"] for t in texts],
            },
        )
        sampling = GenerateRequest(greedy=True, max_new_tokens=8)
        a, b = vllm.generate(req, sampling), hf.generate(req, sampling)
        first = (a.batch["responses"][:, :4] == b.batch["responses"][:, :4]).float().mean().item()
        report["greedy_first4_token_agreement"] = first
        print("FRESHNESS_GPU " + json.dumps(report))
        noise_floor = max(noise.values())
        assert min(moved) > 10 * noise_floor, report  # every agent's scores moved well above bf16 noise
        assert stale > 10 * noise_floor, report  # a skipped sync is caught by the same check
        for name, gaps in fresh.items():
            assert max(gaps) < 3 * noise_floor + 0.02, (
                name,
                report,
            )  # back at the noise floor after the sync
        # greedy tokens are reported, not asserted: on a random bf16 model many steps are near-ties
        # that HF's and vLLM's kernels break differently (measured 0.5 on an H100); the log-prob gaps
        # above are the check
    finally:
        vllm.shutdown()
