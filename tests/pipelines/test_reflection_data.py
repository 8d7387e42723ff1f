"""The pair builder, the accepted turns and the replay, on scripted reflection episodes played by a real
env worker (in this process) against a rollout that answers from a script."""

from __future__ import annotations

import numpy as np
import pytest

from roll_ma.config.schema import AgentConfig, EnvConfig, ModelConfig
from roll_ma.pipelines.phases.reflection_data import (
    Branch,
    accepted_rows,
    branch_specs,
    branches_from_rollout,
    build_pairs,
    episode_texts,
)
from roll_ma.workers.env_worker import EnvWorker, EpisodeSpec, sample_seed
from roll_ma.workers.replay import ScriptedRollout
from roll_ma.workers.worker_specs import EnvWorkerSpec

AGENTS = [AgentConfig(name="actor"), AgentConfig(name="critic")]
PROBLEM = {"problem": "37+48", "answer": "85"}
FIRST, CRITIQUE = "\\boxed{84}", "37+48=85 Incorrect"


@pytest.fixture(scope="module")
def play(tiny_model_dir):
    """play(specs, texts by (episode, turn)) -> (rows, episode summaries) of a 2-round reflection game."""
    model = ModelConfig(path=tiny_model_dir, max_prompt_tokens=256)
    spec = EnvWorkerSpec(env=EnvConfig(name="math_reflection", max_rounds=2), model=model,
                         agents=tuple(AGENTS), seats=("actor", "critic"), seed=0, action_choices=False)
    env = EnvWorker("env", spec=spec)

    def run(specs, texts):
        script = {sample_seed(eid, turn): text for (eid, turn), text in texts.items()}
        batch = env.run_episodes(ScriptedRollout(model, script), [specs], step=0)
        return batch, batch.meta_info["episodes"]

    return run


def test_states_of_a_played_episode(play):
    played = [EpisodeSpec("e0", "g0", 0, PROBLEM), EpisodeSpec("e1", "g0", 0, PROBLEM)]
    batch, _ = play(
        played,
        {
            ("e0", 0): FIRST,
            ("e0", 1): CRITIQUE,
            ("e0", 2): "\\boxed{85}",
            ("e1", 0): "\\boxed{85}",
            ("e1", 1): "37+48=85 Correct",
            ("e1", 2): "\\boxed{85}",
        },
    )
    texts = episode_texts(batch)
    assert texts["e0"] == [FIRST, CRITIQUE, "\\boxed{85}"]
    specs = branch_specs(played, texts, branches=2, states_per_episode=0, seed=0, tag="it0")
    # e0: the problem alone, after its first answer, after its critique;
    # e1: the problem alone is the same state as e0's
    states = {}
    for s in specs:
        states.setdefault(s.group_id, s.problem)
    assert [(p["history"], p["horizon"]) for p in states.values()] == [
        ([], 1),
        ([FIRST], 2),
        ([FIRST, CRITIQUE], 1),
        (["\\boxed{85}"], 2),
        (["\\boxed{85}", "37+48=85 Correct"], 1),
    ]
    assert len(specs) == 2 * len(states) and len({s.episode_id for s in specs}) == len(specs)
    assert len(branch_specs(played, texts, 2, states_per_episode=1, seed=0, tag="it0")) == 2 * 2


@pytest.fixture(scope="module")
def decode(tiny_model_dir):
    from roll_ma.models.loading import load_tokenizer

    tok = load_tokenizer(ModelConfig(path=tiny_model_dir))
    return lambda ids: tok.decode([i for i in ids if i != tok.eos_token_id], skip_special_tokens=False)


def test_pairs_from_scripted_branches(play, decode):
    actor_state = {**PROBLEM, "history": [], "horizon": 1}
    critic_state = {**PROBLEM, "history": [FIRST], "horizon": 2}
    refine_state = {**PROBLEM, "history": [FIRST, CRITIQUE], "horizon": 1}
    specs = (
        [EpisodeSpec(f"a{k}", "A", 0, actor_state) for k in range(4)]
        + [EpisodeSpec(f"c{k}", "C", 0, critic_state) for k in range(4)]
        + [EpisodeSpec(f"r{k}", "R", 0, refine_state) for k in range(2)]
    )
    texts = {
        # actor, first answer: right, wrong, right again (counts once), wrong
        ("a0", 0): "\\boxed{85}",
        ("a1", 0): "\\boxed{80}",
        ("a2", 0): "\\boxed{85}",
        ("a3", 0): "\\boxed{81}",
        # critic: "=85 Incorrect" is followed by a right refinement; "=84 Correct" once by a right and once by
        # a wrong one (ambiguous: never used); "=90 Incorrect" by a wrong one
        ("c0", 0): CRITIQUE,
        ("c0", 1): "\\boxed{85}",
        ("c1", 0): "37+48=84 Correct",
        ("c1", 1): "\\boxed{84}",
        ("c2", 0): "37+48=84 Correct",
        ("c2", 1): "\\boxed{85}",
        ("c3", 0): "37+48=90 Incorrect",
        ("c3", 1): "\\boxed{90}",
        # actor, refinement: both wrong -> no pair
        ("r0", 0): "\\boxed{84}",
        ("r1", 0): "\\boxed{86}",
    }
    batch, episodes = play(specs, texts)
    branches = branches_from_rollout(batch, episodes)
    assert len(branches) == len(specs)  # one first move per branch; the critic states' refinements are not
    by = {b.state: [] for b in branches}
    for b in branches:
        by[b.state].append(b)
    assert [b.success for b in by["A"]] == [True, False, True, False]
    assert [b.success for b in by["C"]] == [True, False, True, False]
    assert {b.agent_id for b in by["A"]} == {0} and {b.agent_id for b in by["C"]} == {1}

    pairs = {p.state: p for p in build_pairs(branches, pairs_per_state=2)}
    assert sorted(pairs) == ["A", "C"]  # R had no right refinement
    assert decode(pairs["A"].chosen_ids) == "\\boxed{85}" and decode(pairs["A"].rejected_ids) == "\\boxed{80}"
    assert (
        decode(pairs["C"].chosen_ids) == CRITIQUE and decode(pairs["C"].rejected_ids) == "37+48=90 Incorrect"
    )
    # the pair's prompt is the critic's context, token for token the one its branches saw
    assert "Problem: 37+48\nSolver: \\boxed{84}" in decode(pairs["C"].prompt_ids)
    assert pairs["C"].prompt_ids == by["C"][0].prompt_ids

    # accepted turns: right answers, critiques followed by a right refinement
    accepted = set(accepted_rows(batch).tolist())
    kept = {(str(batch.non_tensor["episode_id"][i]), int(batch.non_tensor["turn"][i])) for i in accepted}
    assert kept == {("a0", 0), ("a2", 0), ("c0", 0), ("c0", 1), ("c2", 0), ("c2", 1)}


def test_build_pairs_rules():
    def b(state, resp, ok, agent=0, prompt=(1, 2)):
        return Branch(state, agent, prompt, resp, ok)

    branches = [
        b("s", (5,), True),
        b("s", (6,), False),
        b("s", (7,), True),
        b("s", (8,), False),
        b("s", (9,), True),
        b("t", (5,), True),
        b("t", (5,), True),
    ]
    assert [(p.chosen_ids, p.rejected_ids) for p in build_pairs(branches, 1)] == [((5,), (6,))]
    assert [(p.chosen_ids, p.rejected_ids) for p in build_pairs(branches, 5)] == [((5,), (6,)), ((7,), (8,))]
    with pytest.raises(ValueError, match="share one agent and prompt"):
        build_pairs([b("s", (5,), True), b("s", (6,), False, prompt=(3,))])


def test_replay_reproduces_the_episode(play):
    """A teacher's texts replayed: same episode (same rewards), rows in this run's tokens."""
    specs = [EpisodeSpec("t0", "g", 0, {**PROBLEM, "history": [FIRST], "horizon": 2})]
    batch, episodes = play(specs, {("t0", 0): CRITIQUE, ("t0", 1): "\\boxed{85}"})
    assert batch.batch["scores"].tolist() == [1.0, 1.0] and episodes[0]["metrics"]["branch_success"] == 1.0
    assert np.all(batch.non_tensor["adapter_version"] == -1)
