"""Loss terms beyond PPO: their weight follows the step's schedule, and they pull the way they should."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from train_helpers import make_batch, on_policy

from roll_ma.config.schema import AlgorithmConfig, ModelConfig, StudyConfig
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


def _with_choices(rows, choices):
    """``rows`` with every row offered the same candidate answers (token ids)."""
    rows = rows.select()
    rows.non_tensor["action_choices"] = np.empty(len(rows), dtype=object)
    for i in range(len(rows)):
        rows.non_tensor["action_choices"][i] = [list(c) for c in choices]
    return rows


def test_action_entropy_bonus_spreads_the_choice_among_legal_answers(make_strategy):
    # zero advantages: the bonus is the only force, so the measured choice entropy must rise
    rows = _with_choices(make_batch([0, 0, 0, 0], seed=3, advantage=0.0), [[20, 21], [20, 22], [23]])
    s = make_strategy(["a0"], study=StudyConfig(action_entropy_coef=1.0))
    measured = [s.train_step(on_policy(s, rows), UpdateRequest(step=t)).metrics["agent/a0/action_entropy"]
                for t in (1, 2, 3, 4)]
    assert 0.0 < measured[0] and all(a < b for a, b in zip(measured, measured[1:]))
    assert measured[-1] <= math.log(3)


def test_action_entropy_bonus_decays_with_the_entropy_schedule(make_strategy):
    rows = _with_choices(make_batch([0, 0, 0, 0], seed=7), [[20, 21], [22]])

    def after(algo: AlgorithmConfig, step: int, study: StudyConfig | None = None
              ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        s = make_strategy(["a0"], algo=algo, study=study)
        metrics = s.train_step(on_policy(s, rows), UpdateRequest(step=step)).metrics
        return s.adapter_tensors()["a0"], metrics

    def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
        return all(torch.equal(a[k], b[k]) for k in a)

    plain = AlgorithmConfig()
    decayed = AlgorithmConfig(entropy_decay_steps=2)  # the bonus is 0 from step 3
    bonus = StudyConfig(action_entropy_coef=1.0)
    (w_on, m_on), (w_plain, _) = after(decayed, 2, bonus), after(plain, 2)
    assert not same(w_on, w_plain) and "agent/a0/action_entropy" in m_on
    (w_off, m_off), (w_plain, _) = after(decayed, 3, bonus), after(plain, 3)
    assert same(w_off, w_plain) and "agent/a0/action_entropy" not in m_off  # no extra forward once off


def test_action_entropy_bonus_needs_the_rows_choices(make_strategy):
    s = make_strategy(["a0"], study=StudyConfig(action_entropy_coef=0.1))
    with pytest.raises(ValueError, match="carry no 'action_choices'"):
        s.train_step(on_policy(s, make_batch([0, 0])), UpdateRequest(step=1))


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
