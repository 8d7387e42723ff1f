"""Loss terms beyond PPO: their weight follows the step's schedule; the whole answers they score (the action
entropy bonus of ``roll_ma/studies``: tests/studies/test_action_entropy.py)."""

from __future__ import annotations

import pytest
import torch
from train_helpers import make_batch, on_policy

from roll_ma.config.schema import AlgorithmConfig, ModelConfig
from roll_ma.models.logprobs import choice_log_probs, response_log_probs
from roll_ma.protocol.requests import UpdateRequest


def test_decayed_entropy_bonus_acts_until_it_reaches_zero(make_strategy):
    rows = make_batch([0, 0, 0, 0], seed=7)

    def weights_after(algo: AlgorithmConfig, step: int) -> dict[str, torch.Tensor]:
        s = make_strategy(["a0"], algo=algo)
        s.train_step(on_policy(s, rows), UpdateRequest(step=step))
        return s.adapter_tensors()["a0"]

    def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
        return all(torch.equal(a[k], b[k]) for k in a)

    plain = AlgorithmConfig()
    decayed = AlgorithmConfig(entropy_coef=1.0, entropy_decay_steps=2)  # 1.0 at step 1, 0.5 at 2, 0 from 3
    assert not same(weights_after(decayed, 2), weights_after(plain, 2))
    assert same(weights_after(decayed, 3), weights_after(plain, 3))


def test_choice_log_probs_score_each_whole_answer(tiny_model_dir):
    # every candidate's score equals the summed token log-probs of prompt + that answer scored alone
    from roll_ma.models.loading import load_base_model

    model = load_base_model(ModelConfig(path=tiny_model_dir)).eval()
    prompts = [[5, 6, 7], [8, 9]]
    choices = [[[30, 31, 32], [30, 33]], [[40]]]
    width = max(len(p) for p in prompts)
    prompt_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # (2, 3) left-padded
    prompt_mask = (torch.arange(width) >= torch.tensor([[width - len(p)] for p in prompts])).long()
    with torch.no_grad():
        lp, mask = choice_log_probs(model, prompt_ids, prompt_mask, choices)
        for i, row in enumerate(choices):
            for k, answer in enumerate(row):
                ids = torch.tensor([prompts[i] + answer])
                alone, _ = response_log_probs(model, ids, torch.ones_like(ids), len(answer))
                assert lp[i, k].item() == pytest.approx(alone.sum().item(), abs=1e-5)
    assert mask.tolist() == [[1.0, 1.0], [1.0, 0.0]]
