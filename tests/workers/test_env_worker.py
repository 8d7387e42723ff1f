"""Env workers: episodes played against a real rollout worker produce rows credited to who acted."""

import sys
from pathlib import Path

import pytest
import torch

from roll_ma.config.schema import AgentConfig, EnvConfig, LoraConfig, ModelConfig, RolloutConfig
from roll_ma.workers.env_worker import EnvWorker, EpisodeSpec
from roll_ma.workers.rollout_worker import RolloutWorker
from roll_ma.workers.worker_specs import EnvWorkerSpec, RolloutWorkerSpec

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from seat_game import SeatGame  # noqa: E402

HANABI_AGENTS = [AgentConfig(name="p0"), AgentConfig(name="p1")]
MATH_AGENTS = [AgentConfig(name="solver"), AgentConfig(name="critic"), AgentConfig(name="refiner")]


def _rollout(model_dir, agents):
    worker = RolloutWorker("rollout", spec=RolloutWorkerSpec(
        model=ModelConfig(path=model_dir), lora=LoraConfig(rank=4), agents=tuple(agents),
        rollout=RolloutConfig(max_new_tokens=8, micro_batch_size=32), seed=0))
    worker.init_model()
    return worker


def _env_worker(model_dir, env_cfg, agents, seats, max_prompt_tokens=256, action_choices=False):
    return EnvWorker("env", spec=EnvWorkerSpec(
        env=env_cfg, model=ModelConfig(path=model_dir, max_prompt_tokens=max_prompt_tokens),
        agents=tuple(agents), seats=tuple(seats), seed=0, action_choices=action_choices))


def _specs(n, seed=3, group="g"):
    return [[EpisodeSpec(f"{group}-e{k}", group, seed) for k in range(n)]]


@pytest.fixture(scope="module")
def hanabi(tiny_model_dir):
    return _rollout(tiny_model_dir, HANABI_AGENTS), _env_worker(
        tiny_model_dir, EnvConfig(name="tiny_hanabi"), HANABI_AGENTS, ["p0", "p1"]
    )


def test_rows_are_credited_to_the_agent_that_acted(hanabi):
    rollout, env = hanabi
    batch = env.run_episodes(rollout, _specs(4), step=1)
    episodes = batch.meta_info["episodes"]
    assert len(episodes) == 4 and len(batch) == sum(e["turns"] for e in episodes) == 8  # 2 turns per game
    # tiny_hanabi alternates seats: turn 0 is seat 0 (agent p0), turn 1 is seat 1 (agent p1)
    assert batch.non_tensor["agent_id"].tolist() == batch.non_tensor["player"].tolist()
    assert sorted(batch.non_tensor["turn"].tolist()) == [0, 0, 0, 0, 1, 1, 1, 1]
    assert set(batch.non_tensor["adapter_version"].tolist()) == {0}
    # the episode's shared score reaches each player's turn; done marks the last turn of each episode
    for e in episodes:
        rows = batch.non_tensor["episode_id"] == e["episode_id"]
        assert batch.batch["scores"][torch.as_tensor(rows)].sum().item() == pytest.approx(sum(e["returns"]))
        assert batch.non_tensor["done"][rows].tolist().count(True) == 1
    mask = batch.batch["response_mask"]
    assert torch.equal(batch.batch["input_ids"][:, -mask.shape[1] :], batch.batch["responses"])
    assert (batch.batch["rollout_log_probs"] * (1 - mask)).abs().sum() == 0


def test_same_seed_gives_the_same_episodes(hanabi):
    rollout, env = hanabi
    a = env.run_episodes(rollout, _specs(3, seed=11), step=2)
    b = env.run_episodes(rollout, _specs(3, seed=11), step=2)
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    assert a.non_tensor["response_text"].tolist() == b.non_tensor["response_text"].tolist()
    assert [e["returns"] for e in a.meta_info["episodes"]] == [e["returns"] for e in b.meta_info["episodes"]]


def test_builtin_opponent_produces_no_rows(hanabi):
    rollout, env = hanabi
    batch = env.run_episodes(rollout, _specs(3), step=1, seats=["p0", "random"])
    assert len(batch) == 3 and set(batch.non_tensor["agent_id"].tolist()) == {0}


def test_rows_carry_each_legal_actions_answer_when_asked(hanabi, tiny_model_dir):
    rollout, plain = hanabi
    assert all(c == [] for c in plain.run_episodes(rollout, _specs(2), step=1).non_tensor["action_choices"])
    env = _env_worker(tiny_model_dir, EnvConfig(name="tiny_hanabi"), HANABI_AGENTS, ["p0", "p1"],
                      action_choices=True)
    batch = env.run_episodes(rollout, _specs(2), step=1)
    for choices in batch.non_tensor["action_choices"]:
        texts = [env.tokenizer.decode(ids) for ids in choices]
        assert texts == ["<answer>a0</answer>", "<answer>a1</answer>", "<answer>a2</answer>"]


class _RecordingRollout:
    """The real rollout worker, with a log of every generate call (greedy flag, prompts, answers)."""

    def __init__(self, rollout):
        self.rollout, self.calls = rollout, []

    def generate(self, rows, request):
        out = self.rollout.generate(rows, request)
        self.calls.append((request.greedy, [list(p) for p in rows.non_tensor["prompt_ids"]],
                           list(rows.non_tensor["agent_id"]), list(out.non_tensor["response_text"])))
        return out


def test_greedy_moves_are_decoded_and_shown_for_sampled_rollouts_only():
    import re

    from roll_ma.envs.parsing import ActionParser

    # the shipped tiny Hanabi base answers in the game's format, so its greedy answers parse
    model = "builtin:tiny-habits"
    env_cfg = EnvConfig(name="tiny_hanabi", show_greedy_moves=True)
    env = _env_worker(model, env_cfg, HANABI_AGENTS, ["p0", "p1"])
    spy = _RecordingRollout(_rollout(model, HANABI_AGENTS))
    batch = env.run_episodes(spy, _specs(16), step=1)
    assert len(batch) == 32  # the greedy answers add no training rows
    # each round: the sampled call, then the same prompts and agents decoded greedily
    assert [greedy for greedy, *_ in spy.calls] == [False, True, False, True]
    for (_, prompts_a, agents_a, _), (_, prompts_b, agents_b, _) in (spy.calls[0:2], spy.calls[2:4]):
        assert prompts_a == prompts_b and agents_a == agents_b
    # player 1 sees player 0's parsed greedy move (the chosen one where it does not parse)
    parser, labels = ActionParser(("<answer>", "</answer>")), ["a0", "a1", "a2"]
    greedy_moves = [parser.parse(text, labels).action for text in spy.calls[1][3]]
    shown_pairs = []
    for greedy_move, p1_prompt in zip(greedy_moves, spy.calls[2][1], strict=True):
        text = env.tokenizer.decode(p1_prompt)
        chosen, shown = re.search(r"Partner chose (a\d), greedy (a\d)\.", text).groups()
        assert shown == (greedy_move or chosen)
        shown_pairs.append((chosen, shown))
    assert all(greedy_moves)  # the base's greedy answers are well formed ...
    assert any(chosen != shown for chosen, shown in shown_pairs)  # ... and sampling strays from them
    # the agreement metric counts sampled model moves against their greedy answers
    agreement = [e["metrics"]["greedy_agreement"] for e in batch.meta_info["episodes"]]
    assert len(agreement) == 16 and min(agreement) < 1.0
    # a greedy rollout (evaluation) is its own greedy answer: one call a round, nothing to compare
    spy.calls.clear()
    evaluation = env.run_episodes(spy, _specs(2), step=1, greedy=True)
    assert [greedy for greedy, *_ in spy.calls] == [True, True]
    assert all("greedy_agreement" not in e["metrics"] for e in evaluation.meta_info["episodes"])


SEAT_GAME = str(Path(__file__).resolve().parents[2] / "benchmarks" / "seat_game.py") + ":SeatGame"
SEAT_AGENTS = [AgentConfig(name="a0"), AgentConfig(name="a1"), AgentConfig(name="a2")]


def _seat_game_rows(tiny_model_dir, decode_ahead, max_turns=64, turns=3):
    """SeatGame (prompts fixed by seed and turn: it plans its turns) played with decode_ahead on or off."""
    env_cfg = EnvConfig(name=SEAT_GAME, kwargs={"players": 3, "turns": turns}, decode_ahead=decode_ahead,
                        max_turns=max_turns)
    env = _env_worker(tiny_model_dir, env_cfg, SEAT_AGENTS, ["a0", "a1", "a2"])
    spy = _RecordingRollout(_rollout(tiny_model_dir, SEAT_AGENTS))
    specs = [[EpisodeSpec(f"g{s}-e{k}", f"g{s}", s) for s in (4, 5) for k in range(2)]]
    return env.run_episodes(spy, specs, step=1), spy.calls


def test_planned_turns_are_decoded_in_one_call_with_the_same_rows(tiny_model_dir):
    ahead, ahead_calls = _seat_game_rows(tiny_model_dir, decode_ahead=True)
    turnwise, turnwise_calls = _seat_game_rows(tiny_model_dir, decode_ahead=False)
    assert [len(c[1]) for c in ahead_calls] == [12]  # 4 episodes x 3 turns, one generate call
    assert [len(c[1]) for c in turnwise_calls] == [4, 4, 4]  # one round per turn
    assert ahead.meta_info["rounds"] == 1 and turnwise.meta_info["rounds"] == 3
    # the same rows in the same order: per-row seeds make each sample independent of its batch
    for key in ("episode_id", "turn", "player", "agent_id", "done", "response_text"):
        assert ahead.non_tensor[key].tolist() == turnwise.non_tensor[key].tolist(), key
    for key in ("input_ids", "responses", "response_mask", "scores"):
        assert torch.equal(ahead.batch[key], turnwise.batch[key]), key
    torch.testing.assert_close(ahead.batch["rollout_log_probs"], turnwise.batch["rollout_log_probs"])
    # each seat's rows went to the agent of that seat (seat (seed + turn) mod 3)
    seeds = {e["episode_id"]: e["seed"] for e in ahead.meta_info["episodes"]}
    expected = [(seeds[e] + t) % 3 for e, t in zip(ahead.non_tensor["episode_id"], ahead.non_tensor["turn"])]
    assert ahead.non_tensor["agent_id"].tolist() == expected


def test_planned_turns_stop_at_the_turn_cap(tiny_model_dir):
    batch, calls = _seat_game_rows(tiny_model_dir, decode_ahead=True, max_turns=2, turns=5)
    assert [len(c[1]) for c in calls] == [8]  # 2 turns of each of 4 episodes, nothing decoded past the cap
    assert all(e["truncated"] and e["turns"] == 2 for e in batch.meta_info["episodes"])


class _PlanningWrongly(SeatGame):
    """Plans turns whose prompts differ from what step gives (an env that should not plan)."""

    def step(self, action_text):
        result = super().step(action_text)
        if result.next_turn is not None:
            result.next_turn.messages[-1]["content"] += f" (after {action_text[:5]!r})"
        return result


def test_an_env_whose_step_differs_from_its_plan_is_named(tiny_model_dir):
    env_cfg = EnvConfig(name=f"{__file__}:_PlanningWrongly", kwargs={"players": 3, "turns": 3})
    env = _env_worker(tiny_model_dir, env_cfg, SEAT_AGENTS, ["a0", "a1", "a2"])
    with pytest.raises(RuntimeError, match=r"planned turn 1 of episode g-e0 .*env.decode_ahead=false"):
        env.run_episodes(_rollout(tiny_model_dir, SEAT_AGENTS), _specs(2), step=1)
    off = _env_worker(tiny_model_dir, EnvConfig(name=env_cfg.name, kwargs=env_cfg.kwargs, decode_ahead=False),
                      SEAT_AGENTS, ["a0", "a1", "a2"])
    assert len(off.run_episodes(_rollout(tiny_model_dir, SEAT_AGENTS), _specs(2), step=1)) == 6


def test_math_roles_act_in_order(tiny_model_dir):
    rollout = _rollout(tiny_model_dir, MATH_AGENTS)
    env = _env_worker(
        tiny_model_dir, EnvConfig(name="math_selfplay"), MATH_AGENTS, ["solver", "critic", "refiner"]
    )
    specs = [[EpisodeSpec(f"m-e{k}", "m", 5, {"problem": "37+48", "answer": "85"}) for k in range(3)]]
    batch = env.run_episodes(rollout, specs, step=1)
    for e in batch.meta_info["episodes"]:
        rows = batch.non_tensor["episode_id"] == e["episode_id"]
        order = [
            a for _, a in sorted(zip(batch.non_tensor["turn"][rows], batch.non_tensor["agent_id"][rows]))
        ]
        assert (
            order[:2] == [0, 1] and order == [0, 1, 2][: len(order)]
        )  # the refiner only runs after Incorrect


def test_over_long_history_is_cut_from_the_left_keeping_system_and_current(tiny_model_dir):
    env = _env_worker(
        tiny_model_dir, EnvConfig(name="tiny_hanabi"), HANABI_AGENTS, ["p0", "p1"], max_prompt_tokens=60
    )
    messages = [
        {"role": "system", "content": "Rules: be brief."},
        {"role": "user", "content": "old observation " * 50 + "CURRENT OBSERVATION"},
    ]
    ids, truncated = env._encode(messages)
    text = env.tokenizer.decode(ids)
    assert truncated and len(ids) <= 60
    assert "Rules: be brief." in text and text.rstrip().endswith("<|im_start|>assistant")
    assert "CURRENT OBSERVATION" in text and text.count("old observation") < 50


def test_a_round_encoded_together_gives_the_same_rows(hanabi, tiny_model_dir, monkeypatch):
    """env.batch_encode: the round's prompts encoded in one batched call per probe, cuts included, give
    the rows of one prompt at a time."""
    import roll_ma.workers.env_worker as env_worker

    rollout, _ = hanabi
    rounds_together = []  # each round's chats, as the batched path got them

    def recorded(tokenizer, chats, *args, **kwargs):
        rounds_together.append(len(chats))
        return encode_chats(tokenizer, chats, *args, **kwargs)

    encode_chats = env_worker.encode_chats
    monkeypatch.setattr(env_worker, "encode_chats", recorded)
    batches = [
        _env_worker(tiny_model_dir, EnvConfig(name="tiny_hanabi", batch_encode=together), HANABI_AGENTS,
                    ["p0", "p1"], max_prompt_tokens=90).run_episodes(rollout, _specs(4, seed=5), step=1)
        for together in (False, True)
    ]
    alone, together = batches
    # only the second worker took the batched path: one call a round, with every episode's turn in it
    assert rounds_together == [4, 4]  # tiny_hanabi: two rounds of the 4 episodes' turns
    assert any(alone.non_tensor["prompt_truncated"])  # the budget cuts some prompts
    assert alone.non_tensor["prompt_truncated"].tolist() == together.non_tensor["prompt_truncated"].tolist()
    assert torch.equal(alone.batch["input_ids"], together.batch["input_ids"])
    assert torch.equal(alone.batch["responses"], together.batch["responses"])


def test_env_workers_on_ray(ray_session, tiny_model_dir):
    """Two env workers, two engines: env worker i sends its rounds to engine i only (Cluster.share)."""
    from roll_ma.distributed.cluster import Cluster

    rollout = Cluster(
        "rollout",
        RolloutWorker,
        2,
        init_kwargs={"spec": RolloutWorkerSpec(model=ModelConfig(path=tiny_model_dir),
                                               lora=LoraConfig(rank=4), agents=tuple(HANABI_AGENTS),
                                               rollout=RolloutConfig(max_new_tokens=8), seed=0)},
    )
    rollout.init_model()
    envs = Cluster(
        "env",
        EnvWorker,
        2,
        init_kwargs={"spec": EnvWorkerSpec(env=EnvConfig(name="tiny_hanabi"),
                                           model=ModelConfig(path=tiny_model_dir),
                                           agents=tuple(HANABI_AGENTS), seats=("p0", "p1"), seed=0,
                                           action_choices=False)},
    )
    parts = envs.run_episodes(rollout, [_specs(2, group="w0")[0], _specs(3, group="w1")[0]], 1)
    assert [len(p.meta_info["episodes"]) for p in parts] == [2, 3]
    for p in parts:
        assert p.non_tensor["agent_id"].tolist() == p.non_tensor["player"].tolist()
    envs.shutdown()
    rollout.shutdown()
