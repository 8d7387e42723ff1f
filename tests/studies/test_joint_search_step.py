"""The pipeline's joint search step: what it scores, when it distills, and what it asks each agent to learn.

The train worker here is a table of answer probabilities per prompt (the step hands the train worker the
study's ``score_choices`` and ``distill_choices`` through ``score_with`` / ``train_with``; the table answers
them); the real worker is in test_pipeline_e2e.py's run.
"""

import numpy as np
import pytest
import torch
from local_cluster import LocalCluster

from roll_ma.preflight.config_loader import load_config
from roll_ma.protocol import DataProto
from roll_ma.studies.joint_search_step import JointSearch
from roll_ma.studies.joint_search_train import distill_choices, score_choices
from roll_ma.workers.clients import TrainClient
from roll_ma.workers.train_worker import TrainWorker

pytest.importorskip("pyspiel")

# tiny Hanabi's 9 (player 0 signals d0 with a2, keeps a1 with d1) and 10 (d1 signals with a0)
NINE = {"Player 0. Card d0.": 2, "Player 0. Card d1.": 1}
TEN = {"Player 0. Card d0.": 2, "Player 0. Card d1.": 0}
ANSWERS_1 = {(0, 0): 0, (0, 1): 1, (0, 2): 0, (1, 0): 2, (1, 1): 1, (1, 2): 2}  # the 9's reading
ANSWERS_1_TEN = {(0, 0): 2, (0, 1): 1, (0, 2): 0, (1, 0): 0, (1, 1): 1, (1, 2): 2}


class TableTrainer:
    """A train worker's joint-search methods: greedy answer per information set (by its observation line),
    picked at 0.8; records distill calls. Called through the real ``TrainClient`` (``client``)."""

    def __init__(self, search: JointSearch, player0: dict, player1: dict):
        self.search, self.distilled = search, []
        self.picks = []
        for key in search.keys:
            player, seen, _ = search.labels[key]
            if player == 0:
                self.picks.append(player0[seen])
            else:
                card, partner = int(seen.split("Card d")[1][0]), int(seen.split("chose a")[1][0])
                self.picks.append(player1[(card, partner)])

    def score_with(self, scorer, rows: DataProto) -> DataProto:
        assert scorer is score_choices
        probs = torch.full((len(rows), 3), 0.1)
        probs[torch.arange(len(rows)), torch.tensor(self.picks)] = 0.8
        return DataProto.from_dict({"choice_log_probs": probs.log()})

    def client(self) -> TrainClient:
        return TrainClient(LocalCluster(self, TrainWorker, "train"))

    def train_with(self, trainer, rows: DataProto, max_steps: int, stop_prob: float) -> dict[str, float]:
        assert trainer is distill_choices
        self.distilled.append((list(rows.non_tensor["agent_id"]), list(rows.non_tensor["target_action"])))
        self.picks = list(rows.non_tensor["target_action"])  # learned exactly
        return {"player_0/steps": 3.0, "player_1/steps": 5.0}


@pytest.fixture(scope="module")
def search():
    cfg = load_config("tiny_hanabi_selfplay")
    return JointSearch(cfg, ["player_0", "player_1"])


def test_rows_are_every_information_set_with_its_seat_and_answers(search):
    assert len(search.keys) == 8
    agent_of = dict(zip(search.keys, search.rows.non_tensor["agent_id"], strict=True))
    assert sorted(agent_of.values()) == [0, 0] + [1] * 6
    assert all(len(c) == 3 for c in search.rows.non_tensor["action_choices"])
    mask = search.rows.batch["attention_mask"]
    assert (mask[:, -1] == 1).all()  # left-padded: every prompt ends at the last column


def test_a_nine_is_distilled_into_the_ten_and_each_seat_gets_its_own_rows(search):
    trainer = TableTrainer(search, NINE, ANSWERS_1)
    metrics = search.improve(trainer.client(), step=100)
    assert metrics["search/value_greedy"] == pytest.approx(9.0) and metrics["search/value_found"] == 10.0
    assert metrics["search/distilled"] == 1.0 and metrics["search/distill/player_1/steps"] == 5.0
    ((agents, targets),) = trainer.distilled
    want = TableTrainer(search, TEN, ANSWERS_1_TEN).picks
    assert targets == want  # the whole joint policy, not only the changed information sets
    players = [search.labels[k][0] for k in search.keys]
    assert [int(a) for a in agents] == players  # seat 0's rows to player_0, seat 1's to player_1
    assert metrics["search/value_policy_after"] > metrics["search/value_policy"]


def test_nothing_is_distilled_at_the_optimum(search):
    trainer = TableTrainer(search, TEN, ANSWERS_1_TEN)
    metrics = search.improve(trainer.client(), step=200)
    assert metrics["search/value_greedy"] == metrics["search/value_found"] == pytest.approx(10.0)
    assert metrics["search/distilled"] == 0.0 and not trainer.distilled
    assert np.isclose(metrics["search/value_policy"], search.tree.value(search.policy(trainer.client())))


def test_the_loop_takes_the_joint_search_step_only_once_the_studies_are_imported(monkeypatch):
    from types import SimpleNamespace

    import roll_ma.studies  # noqa: F401  (registers the step kind)
    from roll_ma.pipelines.rl import loop
    from roll_ma.studies.joint_search_step import joint_search_step

    run = SimpleNamespace(plan=SimpleNamespace(step_kind="joint_search"))
    assert loop.STUDY_STEPS.get("joint_search", "study.joint_search_every") is joint_search_step
    monkeypatch.setattr(loop.STUDY_STEPS, "_by_name", {})
    with pytest.raises(ValueError, match="study.joint_search_every > 0: the RL step kind 'joint_search' is a "
                       "study.s .*import roll_ma.studies"):
        loop.choose_step(run)
