"""save_checkpoint -> load_checkpoint into a fresh strategy restores everything bit for bit."""

from __future__ import annotations

import pytest
import torch
from train_helpers import learning_metrics, make_batch, on_policy

from roll_ma.config.schema import ModelConfig
from roll_ma.protocol.requests import UpdateRequest

AGENTS = ["a0", "a1"]


def _states_equal(a: dict, b: dict) -> bool:
    lists = all(len(a[k]) == len(b[k]) and all(torch.equal(x, y) for x, y in zip(a[k], b[k], strict=True))
                for k in ("exp_avg", "exp_avg_sq", "step"))
    return lists and all(a[k] == b[k] for k in ("global_steps", "scheduler_steps", "lr"))


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_save_load_is_bit_exact_and_training_continues_identically(make_strategy, tmp_path, zero_stage):
    kwargs = dict(zero_stage=zero_stage, warmup_steps=3)  # a moving lr: the scheduler state must come back
    s = make_strategy(AGENTS, **kwargs)
    for step, agents in enumerate([[0, 0, 1], [1, 1, 0, 0], [0, 1]]):
        s.train_step(on_policy(s, make_batch(agents, seed=10 + step)), UpdateRequest(step=step))
    s.save_checkpoint(tmp_path)

    names = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert names == ["adapters/a0/adapter_config.json", "adapters/a0/adapter_model.safetensors",
                     "adapters/a1/adapter_config.json", "adapters/a1/adapter_model.safetensors",
                     "optim/a0/rank0.pt", "optim/a1/rank0.pt"]  # no base weights anywhere
    assert sum(p.stat().st_size for p in tmp_path.rglob("*.pt")) < 1_000_000

    fresh = make_strategy(AGENTS, **kwargs)
    fresh.load_checkpoint(tmp_path)
    probe = make_batch([0, 1, 1, 0, 1], seed=20)
    assert torch.equal(s.compute_log_probs(probe).batch["old_log_probs"],
                       fresh.compute_log_probs(probe).batch["old_log_probs"])
    for name in AGENTS:
        assert _states_equal(s.optimizer_state(name), fresh.optimizer_state(name))

    for step in (3, 4):
        batch = make_batch([0, 1, 0, 1], seed=30 + step)
        request = UpdateRequest(step=step)
        m1 = s.train_step(on_policy(s, batch), request).metrics
        m2 = fresh.train_step(on_policy(fresh, batch), request).metrics
        assert learning_metrics(m1) == learning_metrics(m2)
    after, fresh_after = s.adapter_tensors(), fresh.adapter_tensors()
    assert all(torch.equal(after[a][k], fresh_after[a][k]) for a in AGENTS for k in after[a])
    for name in AGENTS:
        assert _states_equal(s.optimizer_state(name), fresh.optimizer_state(name))


def test_saved_adapter_loads_with_peft(make_strategy, tiny_model_dir, tmp_path):
    from peft import PeftModel

    from roll_ma.models.loading import load_base_model
    from roll_ma.training.scoring import score_rows

    s = make_strategy(AGENTS)
    s.train_step(on_policy(s, make_batch([0, 1, 1], seed=40)))
    s.save_checkpoint(tmp_path)
    rows = make_batch([1, 1, 1], seed=41)
    peft_model = PeftModel.from_pretrained(load_base_model(ModelConfig(path=tiny_model_dir)),
                                           str(tmp_path / "adapters" / "a1"), adapter_name="a1").eval()
    want = score_rows(peft_model, rows, 8, torch.device("cpu"))[0]
    got = s.compute_log_probs(rows).batch["old_log_probs"]
    assert torch.allclose(got, want, atol=1e-5)
