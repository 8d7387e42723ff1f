"""One agent's update never touches another agent's adapter, Adam moments or step count (bit for bit)."""

from __future__ import annotations

import pytest
import torch
from train_helpers import all_finite, make_batch, on_policy, same_optimizer_state

from roll_ma.protocol.requests import UpdateRequest

AGENTS = ["a0", "a1", "a2"]
ORDER = [0, 2, 0, 1, 2]  # interleaved: an agent trains again after others did


def _opt_states(strategy) -> dict:
    return {name: strategy.optimizer_state(name) for name in AGENTS}


_same_state = same_optimizer_state  # (the joint search's test reads it too: train_helpers)


@pytest.mark.parametrize("zero_stage", [0, 1, 2])
def test_update_touches_only_its_agent(make_strategy, zero_stage):
    s = make_strategy(AGENTS, zero_stage=zero_stage)
    for step, k in enumerate(ORDER):
        batch = on_policy(s, make_batch([k] * 4, seed=step))
        weights, states = s.adapter_tensors(), _opt_states(s)
        metrics = s.train_step(batch, UpdateRequest(step=step)).metrics
        new_weights, new_states = s.adapter_tensors(), _opt_states(s)
        trained = AGENTS[k]
        assert metrics[f"agent/{trained}/updated"] == 1.0 and all_finite(metrics)
        assert all(not torch.equal(weights[trained][n], new_weights[trained][n]) for n in weights[trained]), \
            f"step {step}: some tensor of {trained} did not move"
        assert new_states[trained]["global_steps"] == states[trained]["global_steps"] + 1
        for other in AGENTS:
            if other == trained:
                continue
            assert metrics[f"agent/{other}/updated"] == 0.0
            assert all(torch.equal(weights[other][n], new_weights[other][n]) for n in weights[other]), \
                f"step {step}: updating {trained} changed {other}'s adapter"
            assert _same_state(states[other], new_states[other]), \
                f"step {step}: updating {trained} changed {other}'s optimizer state"


def test_switching_adapters_runs_what_pefts_set_adapter_runs(make_strategy):
    s = make_strategy(AGENTS)
    weights, model = s.weights, s.weights.model
    ids = torch.randint(3, 500, (2, 10), generator=torch.Generator().manual_seed(0))
    for name in ("a2", "a0", "a1"):
        weights.activate(name)  # roll_ma's switch on the cached LoRA layers
        ours = model(input_ids=ids).logits
        layers = [m for m in model.modules() if hasattr(m, "active_adapters") and hasattr(m, "lora_A")]
        assert layers and all(m.active_adapters == [name] for m in layers)
        assert model.active_adapter == name
        model.set_adapter(name)  # PEFT's own
        assert torch.equal(ours, model(input_ids=ids).logits)
    with pytest.raises(ValueError, match="adapter 'nope' is not on the model"):
        weights.activate("nope")
