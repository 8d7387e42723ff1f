import random

import pytest

from roll_ma.envs import make_env
from roll_ma.envs.hanabi import hanabi_config, hanabi_deck_size
from roll_ma.envs.hanabi_view import describe_move, parse_card, parse_observation

OBS = """Life tokens: 2
Info tokens: 7
Fireworks: R1 Y0 G1
Hands:
Cur player
XX || XX|RYG123
XX || X2|RG2
-----
Y1 || YX|Y123
G3 || XX|RYG13
Deck size: 4
Discards: R1 G1"""


def test_presets_and_overrides():
    assert hanabi_config(2, "mini") == {
        "colors": 2,
        "ranks": 2,
        "hand_size": 3,
        "max_information_tokens": 3,
        "max_life_tokens": 3,
        "players": 2,
    }
    assert hanabi_config(2, "simple")["colors"] == 3 and hanabi_config(2, "simple")["ranks"] == 2
    assert hanabi_config(2, "full")["ranks"] == 3
    assert hanabi_config(4, "full")["hand_size"] == 4  # one card fewer with 4-5 players
    assert hanabi_config(2, "full", hand_size=4, max_life_tokens=1)["max_life_tokens"] == 1
    assert hanabi_deck_size(5, 5) == 50 and hanabi_deck_size(2, 2) == 8 and hanabi_deck_size(3, 3) == 18
    env = make_env("hanabi", preset="standard", players=3)
    assert env.max_utility == 25 and env.num_players == 3


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"preset": "huge"}, "Unknown hanabi preset"),
        ({"players": 6}, "2-5 players"),
        ({"preset": "mini", "players": 4, "hand_size": 3}, "hand_size<=2"),
        ({"colors": 7}, "colors and ranks"),
    ],
)
def test_bad_configs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_env("hanabi", **kwargs)


def test_parse_observation():
    view = parse_observation(OBS)
    assert (view.life_tokens, view.info_tokens, view.deck_size) == (2, 7, 4)
    assert view.fireworks == {"R": 1, "Y": 0, "G": 1}
    assert view.discards == ["R1", "G1"]
    assert len(view.hands) == 2 and view.current_hand == 0
    own = view.hands[0][1]
    assert own.color is None and own.hinted_rank == 2 and own.possible_colors == "RG"
    assert own.candidates() == [("R", 2), ("G", 2)]
    assert all(view.is_playable(c, r) for c, r in own.candidates())
    other = view.hands[1][0]
    assert (other.color, other.rank, other.hinted_color) == ("Y", 1, "Y")
    assert parse_card("G3 || XX|RYG13").possible_ranks == (1, 3)


def test_scripted_plays_a_known_playable_card(monkeypatch):
    # with OBS, own card 1 is R2 or G2 and both fireworks stand at 1: the card is surely playable
    env = make_env("hanabi", preset="full")
    env.reset(0)
    monkeypatch.setattr(env, "view", lambda state, player: parse_observation(OBS))
    action = env.scripted_action(env.state, 0, random.Random(0))
    assert env.state.action_to_string(0, action) == "(Play 1)"


def test_describe_move():
    assert describe_move(1, "(Reveal player +1 color R)", 2, 0) == "player 1 told you: color R"
    assert describe_move(3, "(Reveal player +2 rank 1)", 4, 0) == "player 3 told player 1: rank 1"
    assert describe_move(0, "(Play 2)", 2, 0) == "you played card 2"
    assert describe_move(1, "(Discard 0)", 2, 0) == "player 1 discarded card 0"


def test_rendered_turn():
    env = make_env("hanabi", preset="mini", seat_agents=["alice", "bob"])
    turn = env.reset(1)
    user = turn.messages[1]["content"]
    assert user.startswith("You are player 0 of 2.\nLife tokens: 3 of 3. Info tokens: 3 of 3.")
    assert "Your hand (you cannot see your cards):" in user and "Player +1 (player 1) hand:" in user
    assert "(score 0 of 4)" in user
    result = env.step("<answer>Reveal player +1 rank 1</answer>")
    if not result.info["format_error"]:
        assert "player 0 told you: rank 1" in result.next_turn.messages[1]["content"]
    # every label of a random game parses back (also covered by the 200-game test)
    rng = random.Random(0)
    while not result.done:
        result = env.step(env.builtin_action("random", rng))
    assert 0 <= env.episode_metrics()["score"] <= 4
