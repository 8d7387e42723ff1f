"""The entropy bonus over a game's legal actions (``studies/action_entropy.py``): it spreads the choice,
decays with the entropy schedule, needs the rows' answers, and reaches the train workers only through the
run plan and ``roll_ma.studies``' registration."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch
from train_helpers import make_batch, on_policy, worker_spec

from roll_ma.config.schema import AgentConfig, AlgorithmConfig, ModelConfig, StudyConfig
from roll_ma.protocol.requests import UpdateRequest
from roll_ma.studies.action_entropy import action_entropy_bonus

BONUS = (action_entropy_bonus,)  # the train worker's spec.loss_terms of a run with the bonus on


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
    s = make_strategy(["a0"], study=StudyConfig(action_entropy_coef=1.0), loss_terms=BONUS)
    measured = [s.train_step(on_policy(s, rows), UpdateRequest(step=t)).metrics["agent/a0/action_entropy"]
                for t in (1, 2, 3, 4)]
    assert 0.0 < measured[0] and all(a < b for a, b in zip(measured, measured[1:]))
    assert measured[-1] <= math.log(3)


def test_action_entropy_bonus_decays_with_the_entropy_schedule(make_strategy):
    rows = _with_choices(make_batch([0, 0, 0, 0], seed=7), [[20, 21], [22]])

    def after(algo: AlgorithmConfig, step: int, study: StudyConfig | None = None
              ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        s = make_strategy(["a0"], algo=algo, study=study, loss_terms=BONUS if study else ())
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
    s = make_strategy(["a0"], study=StudyConfig(action_entropy_coef=0.1), loss_terms=BONUS)
    with pytest.raises(ValueError, match="carry no 'action_choices'"):
        s.train_step(on_policy(s, make_batch([0, 0])), UpdateRequest(step=1))


def test_the_train_workers_get_the_bonus_only_once_the_studies_are_imported(monkeypatch):
    import roll_ma.studies  # noqa: F401  (registers the loss term)
    from roll_ma.pipelines import clusters

    assert clusters.study_loss_terms(("action_entropy",)) == BONUS and clusters.study_loss_terms(()) == ()
    spec = worker_spec(ModelConfig(), [AgentConfig(name="a0")], loss_terms=BONUS)
    assert pickle.loads(pickle.dumps(spec)).loss_terms == BONUS  # shipped by reference: the worker imports it
    monkeypatch.setattr(clusters.STUDY_LOSS_TERMS, "_by_name", {})
    refused = r"study.action_entropy_coef > 0: the PPO loss term 'action_entropy' .* import roll_ma.studies"
    with pytest.raises(ValueError, match=refused):
        clusters.study_loss_terms(("action_entropy",))
