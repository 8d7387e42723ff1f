"""Distilling chosen answers (joint search) trains each row's own agent only, until it picks them."""

from __future__ import annotations

import pytest
import torch
from train_helpers import same_optimizer_state as _same_state

from roll_ma.protocol import DataProto
from roll_ma.studies.joint_search_train import distill_choices, score_choices

AGENTS = ["a0", "a1"]
# three legal answers of 1, 1 and 2 tokens (a random tiny model's logits span little, so the target
# is a one-token answer and "picked" means at 0.6)
CHOICES = [[100], [102], [103, 104]]


def _rows(agent_ids: list[int], targets: list[int]) -> DataProto:
    gen = torch.Generator().manual_seed(0)
    n = len(agent_ids)
    prompts = torch.randint(3, 500, (n, 4), generator=gen)
    prompts[0, 0] = 0  # the first row is left-padded by one token
    mask = torch.ones(n, 4, dtype=torch.long)
    mask[0, 0] = 0
    columns = {"agent_id": agent_ids, "action_choices": [CHOICES] * n, "target_action": targets}
    return DataProto.from_dict({"input_ids": prompts, "attention_mask": mask}, columns)


def test_score_choices_pads_rows_with_fewer_answers(make_strategy):
    s = make_strategy(AGENTS)
    rows = _rows([0, 1], [0, 0])
    rows.non_tensor["action_choices"][1] = CHOICES[:2]
    lp = score_choices(s, rows).batch["choice_log_probs"]  # (2, 3)
    assert lp.shape == (2, 3) and torch.isfinite(lp[0]).all() and torch.isfinite(lp[1, :2]).all()
    assert lp[1, 2] == float("-inf") and (lp[:, :2] < 0).all()


def test_distill_teaches_the_rows_agent_and_leaves_the_other_bit_for_bit(make_strategy):
    s = make_strategy(AGENTS, lr=1e-2)
    rows = _rows([1], [0])
    probs = torch.softmax(score_choices(s, rows).batch["choice_log_probs"], -1)  # (1, 3)
    least = int(probs[0, :2].argmin())
    rows.non_tensor["target_action"][0] = least  # the one-token answer it picks less now
    before_w = s.adapter_tensors()
    before_opt = {a: s.optimizer_state(a) for a in AGENTS}
    metrics = distill_choices(s, rows, max_steps=200, stop_prob=0.6)
    after_w = s.adapter_tensors()
    assert metrics["a1/target_prob_min_after"] >= 0.6 > metrics["a1/target_prob_min_before"]
    assert 0 < metrics["a1/steps"] < 200 and "a0/steps" not in metrics
    probs = torch.softmax(score_choices(s, rows).batch["choice_log_probs"], -1)  # (1, 3)
    assert int(probs.argmax()) == least
    assert all(torch.equal(before_w["a0"][n], after_w["a0"][n]) for n in before_w["a0"])
    assert _same_state(before_opt["a0"], s.optimizer_state("a0"))
    assert s.optimizer_state("a1")["global_steps"] == int(metrics["a1/steps"])


def test_distill_stops_at_once_when_the_answers_are_already_picked(make_strategy):
    s = make_strategy(AGENTS)
    rows = _rows([0], [0])
    probs = torch.softmax(score_choices(s, rows).batch["choice_log_probs"], -1)  # (1, 3)
    picked = int(probs.argmax())
    rows.non_tensor["target_action"][0] = picked
    metrics = distill_choices(s, rows, max_steps=50, stop_prob=float(probs.max()) - 1e-4)
    assert metrics["a0/steps"] == 0.0 and s.optimizer_state("a0")["global_steps"] == 0


def test_a_backend_that_is_no_policy_set_is_refused_by_name():
    with pytest.raises(ValueError, match=r"study.joint_search_every > 0: .*policy set .*not a object; "
                                         r"use one of those or set study.joint_search_every=0"):
        score_choices(object(), _rows([0], [0]))
