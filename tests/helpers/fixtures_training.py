"""Fixtures of the train-side tests: adapters that differ from the base (on tests/conftest.py's tiny
model) and strategies built in-process (world size 1, gloo)."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch

# DeepSpeed must never JIT-compile in these tests: point its extension cache at an empty dir we can check.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", tempfile.mkdtemp(prefix="roll_ma_torch_ext_"))

from train_helpers import LORA  # noqa: E402

from roll_ma.config.schema import (  # noqa: E402
    AgentConfig,
    AlgorithmConfig,
    CriticConfig,
    ModelConfig,
    StudyConfig,
    TrainConfig,
)


@pytest.fixture(scope="session")
def adapter_init_dir(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], str]:
    """PEFT dir of adapter ``name`` with nonzero lora_B: it differs from the base and lora_A gets gradients.

    Perturbed before any engine exists (through AgentConfig.init_adapter): at ZeRO 1/2 the
    optimizer keeps its own fp32 master copy, so editing parameters after initialize would not stick.
    """
    from roll_ma.models.adapters import AdapterSpec, inject_adapters, save_adapter
    from roll_ma.models.loading import load_base_model

    root = tmp_path_factory.mktemp("adapter_init")
    made: dict[str, str] = {}

    def make(name: str) -> str:
        if name not in made:
            spec = AdapterSpec(name, LORA.rank, LORA.alpha, LORA.dropout, tuple(LORA.target_modules))
            model = inject_adapters(load_base_model(ModelConfig(path=tiny_model_dir)), [spec], seed=0)
            gen = torch.Generator().manual_seed(len(made) + 1)
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if "lora_B" in n:
                        p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
            made[name] = str(save_adapter(model, spec, root / name))
        return made[name]

    return make


@pytest.fixture(scope="session")
def make_strategy(tiny_model_dir: str, adapter_init_dir: Callable[[str], str]) -> Callable[..., Any]:
    """Build and initialize a train strategy in this process (rank 0 of 1).

    ``agents``: AgentConfig objects or names; each gets its adapter from ``adapter_init_dir``. ``model``:
    ModelConfig keys beside the tiny model's path and dtype.
    """
    from roll_ma.config.run_plan import prompt_sharing
    from roll_ma.models.adapters import plan_adapters
    from roll_ma.training import train_strategy_class

    def make(agents: Sequence[AgentConfig | str], zero_stage: int = 0, algo: AlgorithmConfig | None = None,
             strategy: str = "multi_agent_deepspeed", seed: int = 0, dtype: str = "float32",
             reference_copies: bool = False, study: StudyConfig | None = None,
             critic: CriticConfig | None = None, model: dict | None = None, loss_terms: tuple = (),
             **train_kwargs: Any) -> Any:
        cfgs = [AgentConfig(name=a) if isinstance(a, str) else a for a in agents]
        cfgs = [a if a.init_adapter else dataclasses.replace(a, init_adapter=adapter_init_dir(a.adapter_name))
                for a in cfgs]
        agent_specs, adapter_specs = plan_adapters(LORA, cfgs)
        train_kwargs.setdefault("lr", 1e-2)
        train_cfg = TrainConfig(strategy=strategy, zero_stage=zero_stage, **train_kwargs)
        cls = train_strategy_class(strategy)
        model_cfg = ModelConfig(path=tiny_model_dir, dtype=dtype, **(model or {}))
        if "share_prompt_prefix" not in train_kwargs:  # decided as a run's plan decides it for its workers
            sharing = prompt_sharing(train_cfg, model_cfg.attn_implementation)
            train_cfg = dataclasses.replace(train_cfg, share_prompt_prefix=sharing)
        s = cls(model_cfg, agent_specs, adapter_specs, train_cfg, algo or AlgorithmConfig(), seed=seed,
                reference_copies=reference_copies, study_cfg=study, critic_cfg=critic,
                loss_terms=loss_terms)
        s.initialize()
        return s

    return make
