"""GAE over an agent's turns, team reward, the clipped value loss: checked against hand arithmetic."""

import pytest
import torch

from roll_ma.algorithms.advantages import add_advantages
from roll_ma.algorithms.gae import explained_variance, gae_advantages
from roll_ma.algorithms.losses import clipped_value_loss
from roll_ma.algorithms.turn_rewards import team_turn_rewards
from roll_ma.config.schema import AlgorithmConfig
from roll_ma.protocol import DataProto

# One episode, two agents taking turns: Reasoner (player 0) at turns 0 and 2, Actor (player 1) at
# turns 1 and 3; the Actor's turns earn 1.0 and 0.5. Response widths R = 2 (right-padded).
#   row  player turn  tokens  values     reward
#   0    0      0     2       .1 .2      0
#   1    1      1     1       .5         1.0
#   2    0      2     1       .3         0
#   3    1      3     2       .4 .6      0.5
# A second episode (rows 4, 5) must not mix with the first.
MASK = torch.tensor([[1, 1], [1, 0], [1, 0], [1, 1], [1, 0], [1, 0]], dtype=torch.float32)
VALUES = torch.tensor([[.1, .2], [.5, 0], [.3, 0], [.4, .6], [.7, 0], [.2, 0]])
SCORES = [0.0, 1.0, 0.0, 0.5, 0.0, 1.0]
EPISODES = ["e0", "e0", "e0", "e0", "e1", "e1"]
PLAYERS = [0, 1, 0, 1, 0, 1]
TURNS = [0, 1, 2, 3, 0, 1]
GAMMA, LAM = 0.9, 0.8


def test_team_reward_reaches_earlier_agents_only_when_shared():
    own = team_turn_rewards(SCORES, EPISODES, PLAYERS, TURNS, share=False)
    shared = team_turn_rewards(SCORES, EPISODES, PLAYERS, TURNS, share=True)
    assert own.tolist() == SCORES
    # turn 1's 1.0 reaches the Reasoner's turn 0; turn 3's 0.5 its turn 2; e1's Actor reward its turn 0
    assert shared.tolist() == [1.0, 1.0, 0.5, 0.5, 1.0, 1.0]


def _token_rewards(turn_rewards):
    from roll_ma.algorithms.turn_rewards import place_on_last_token

    return place_on_last_token(torch.tensor(turn_rewards), MASK)


def test_gae_matches_hand_computation_over_a_multi_turn_episode():
    rewards = team_turn_rewards(SCORES, EPISODES, PLAYERS, TURNS, share=True)
    adv, ret = gae_advantages(_token_rewards(rewards), VALUES, MASK, EPISODES, PLAYERS, TURNS, GAMMA, LAM)
    # Reasoner chain of e0: tokens (row0,c0) v=.1 r=0, (row0,c1) v=.2 r=1, (row2,c0) v=.3 r=.5
    #   last:   delta = .5 + .9*0 - .3 = .2;               A = .2
    #   middle: delta = 1 + .9*.3 - .2 = 1.07;             A = 1.07 + .72*.2 = 1.214
    #   first:  delta = 0 + .9*.2 - .1 = .08;              A = .08 + .72*1.214 = .95408
    assert adv[0].tolist() == pytest.approx([0.95408, 1.214], abs=1e-5)
    assert adv[2, 0].item() == pytest.approx(0.2, abs=1e-6)
    # Actor chain of e0: (row1,c0) v=.5 r=1, (row3,c0) v=.4 r=0, (row3,c1) v=.6 r=.5
    #   last:   delta = .5 - .6 = -.1;                     A = -.1
    #   middle: delta = .9*.6 - .4 = .14;                  A = .14 + .72*(-.1) = .068
    #   first:  delta = 1 + .9*.4 - .5 = .86;              A = .86 + .72*.068 = .90896
    assert adv[1, 0].item() == pytest.approx(0.90896, abs=1e-5)
    assert adv[3].tolist() == pytest.approx([0.068, -0.1], abs=1e-6)
    # e1: each agent one token, reward 1 on both (shared): A = 1 - v
    assert adv[4, 0].item() == pytest.approx(1 - 0.7, abs=1e-6)
    assert adv[5, 0].item() == pytest.approx(1 - 0.2, abs=1e-6)
    # value targets: A + V on real tokens, 0 on padding
    assert torch.allclose(ret, (adv + VALUES) * MASK)
    assert adv[1, 1].item() == 0.0 and ret[1, 1].item() == 0.0


def test_lambda_one_gives_discounted_return_minus_value():
    rewards = team_turn_rewards(SCORES, EPISODES, PLAYERS, TURNS, share=False)
    adv, ret = gae_advantages(_token_rewards(rewards), VALUES, MASK, EPISODES, PLAYERS, TURNS, 0.5, 1.0)
    # Actor e0, first token: G = 1 + .5*0 + .25*.5 = 1.125 (three tokens later, the .5)
    assert ret[1, 0].item() == pytest.approx(1.125, abs=1e-6)
    assert adv[1, 0].item() == pytest.approx(1.125 - 0.5, abs=1e-6)


def _batch():
    return DataProto.from_dict(
        {"scores": torch.tensor(SCORES), "response_mask": MASK, "values": VALUES},
        {"episode_id": EPISODES, "player": PLAYERS, "turn": TURNS, "agent_id": PLAYERS,
         "group_id": ["g"] * 6},
    )


@pytest.mark.parametrize("share", [False, True])
def test_value_targets_per_agent_with_and_without_team_reward(share):
    algo = AlgorithmConfig(advantage="gae", gamma=1.0, lam=1.0, norm_std=False, share_reward_in_agent=share)
    out = add_advantages(_batch(), algo)
    ret = out.batch["returns"]
    # lam = gamma = 1: the target of a Reasoner token is the sum of the rewards its chain earns from there on
    reasoner_first = ret[0, 0].item()
    assert reasoner_first == pytest.approx(1.5 if share else 0.0, abs=1e-6)
    assert ret[2, 0].item() == pytest.approx(0.5 if share else 0.0, abs=1e-6)
    assert ret[4, 0].item() == pytest.approx(1.0 if share else 0.0, abs=1e-6)
    # the Actor is rewarded itself either way
    assert ret[1, 0].item() == pytest.approx(1.5, abs=1e-6)
    assert out.batch["trained_rewards"].tolist() == ([1.0, 1.0, 0.5, 0.5, 1.0, 1.0] if share else SCORES)


def test_gae_needs_values():
    algo = AlgorithmConfig(advantage="gae")
    batch = _batch()
    batch.pop(batch_keys=["values"])
    with pytest.raises(ValueError, match="values"):
        add_advantages(batch, algo)


def test_whitened_advantages_have_zero_mean_per_agent():
    out = add_advantages(_batch(), AlgorithmConfig(advantage="gae", gamma=GAMMA, lam=LAM, norm_std=True))
    adv, m = out.batch["advantages"], MASK.bool()
    for agent in (0, 1):
        rows = torch.tensor([p == agent for p in PLAYERS])
        x = adv[m & rows[:, None]]
        assert x.mean().item() == pytest.approx(0.0, abs=1e-6)
        assert x.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)


def test_clipped_value_loss_by_hand():
    values = torch.tensor([[1.0, 0.0]])
    old = torch.tensor([[0.5, 0.5]])
    returns = torch.tensor([[2.0, 0.0]])
    mask = torch.ones(1, 2)
    loss, stats = clipped_value_loss(values, old, returns, mask, cliprange=0.2)
    # token 0: unclipped (1-2)^2 = 1; clipped V = .5 + .2 = .7 -> (.7-2)^2 = 1.69; max 1.69 (clipped wins)
    # token 1: unclipped (0-0)^2 = 0; clipped V = .5 - .2 = .3 -> .09; max .09 (clipped wins)
    assert loss.item() == pytest.approx(0.5 * (1.69 + 0.09) / 2, abs=1e-6)
    assert stats["value_clip_frac"] == pytest.approx(1.0)
    # a value moving toward the target inside the clip range is not clipped
    loss2, stats2 = clipped_value_loss(torch.tensor([[0.6]]), torch.tensor([[0.5]]), torch.tensor([[1.0]]),
                                       torch.ones(1, 1), cliprange=0.2)
    assert loss2.item() == pytest.approx(0.5 * 0.16, abs=1e-6) and stats2["value_clip_frac"] == 0.0
    # cliprange 0: plain squared error
    loss3, _ = clipped_value_loss(values, old, returns, mask, cliprange=0.0)
    assert loss3.item() == pytest.approx(0.5 * (1.0 + 0.0) / 2, abs=1e-6)


def test_explained_variance():
    mask = torch.ones(1, 4)
    r = torch.tensor([[0.0, 1.0, 0.0, 1.0]])
    assert explained_variance(r, r, mask) == pytest.approx(1.0)
    assert explained_variance(r, torch.full_like(r, 0.5), mask) == pytest.approx(0.0)
    assert explained_variance(r, 1 - r, mask) == pytest.approx(-3.0)  # Var(2r - 1) = 1 vs Var(r) = 0.25
    assert explained_variance(torch.ones(1, 4), torch.zeros(1, 4), mask) == 0.0


def test_use_all_traj_false_keeps_each_agents_last_turn():
    from roll_ma.algorithms.gae import last_turns_only

    kept = last_turns_only(_batch())
    # e0: reasoner's turn 2 and actor's turn 3; e1: both single turns
    assert sorted(zip(kept.non_tensor["episode_id"], kept.non_tensor["turn"])) == [
        ("e0", 2), ("e0", 3), ("e1", 0), ("e1", 1)]


def test_critic_per_group_shared_or_per_agent():
    from roll_ma.models.adapters import AgentSpec
    from roll_ma.training.critic import critic_of_agents

    agents = [AgentSpec(i, n, n) for i, n in enumerate(["reasoner", "actor", "judge"])]
    assert set(critic_of_agents(agents, share=True).values()) == {"value_critic"}
    assert critic_of_agents(agents, share=False)[2] == "value_critic-judge"
    grouped = critic_of_agents(agents, share=True, groups=[["reasoner", "actor"]])
    assert grouped == {0: "value_critic-group0", 1: "value_critic-group0", 2: "value_critic-judge"}


@pytest.mark.parametrize("advantage", ["grpo", "gae"])
def test_kl_in_the_reward_reaches_the_token_rewards_and_the_advantages(advantage):
    """kl_mode=reward, k1 with log pi_old - log pi_ref = 0.5 on every real token: a penalty of -coef * 0.5
    per token. GRPO adds its return-to-go within the turn; GAE (gamma = lam = 1) carries it back through
    the agent's whole chain, so its targets drop by the penalty times the tokens left in the chain."""
    coef, gap = 0.2, 0.5
    penalty = -coef * gap
    kwargs = dict(advantage=advantage, gamma=1.0, lam=1.0, norm_std=False)
    plain = add_advantages(_batch(), AlgorithmConfig(**kwargs))
    batch = _batch()
    batch.batch["old_log_probs"] = torch.full_like(MASK, -1.0)
    batch.batch["ref_log_probs"] = torch.full_like(MASK, -1.0 - gap)
    kl = add_advantages(batch, AlgorithmConfig(kl_coef=coef, kl_mode="reward", kl_estimator="k1", **kwargs))
    torch.testing.assert_close(kl.batch["token_rewards"] - plain.batch["token_rewards"], penalty * MASK)
    left_in_turn = torch.tensor([[2, 1], [1, 0], [1, 0], [2, 1], [1, 0], [1, 0]], dtype=torch.float32)
    # the chains of episode e0: Reasoner rows 0 -> 2 (3 tokens), Actor rows 1 -> 3 (3 tokens)
    left_in_chain = torch.tensor([[3, 2], [3, 0], [1, 0], [2, 1], [1, 0], [1, 0]], dtype=torch.float32)
    left = left_in_chain if advantage == "gae" else left_in_turn
    torch.testing.assert_close(kl.batch["advantages"] - plain.batch["advantages"], penalty * left)
