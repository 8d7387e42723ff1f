"""AT-GRPO's relay game without verl: one game of the job's SeatGame played seat after seat through a
``generate`` coroutine, each turn a row with its AT-GRPO group id (game, turn, seat).

PettingLLMs (github.com/pettingllms-ai/PettingLLMs, trainer/multi_agents_execution_engine.py) plays each
env copy turn by turn, every agent's prompt built from the env state (here: SeatGame's relay prompt, which
carries the earlier replies), and groups a turn's rows by ``(env, turn, agent)`` (its
``_assign_consistent_uids``), so GRPO compares one agent's samples at one turn of one game. Its ``no_tree``
rollout keeps the copies independent; that is what this plays, one copy per call.

atgrpo_loop.py runs this inside verl's agent-loop workers, and the CPU tests run it as it is. It imports no
verl: the game and the grouping are tested without it. The game is benchmarks/seat_game.py's SeatGame, built
with the arguments job.seat_game gives roll_ma's runs, so both play the same prompts.
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:  # seat_game.py lives in benchmarks/ (job.seat_game does the same)
    sys.path.insert(0, str(HERE.parent))

from seat_game import SeatGame  # noqa: E402

GAME_KEY = "atgrpo_game"  # a dataset row's extra_info key: the game (seed and SeatGame arguments) it plays
TURN_KEY = "atgrpo_turn"  # an output's extra_fields keys: the turn it answers and the seat that acted
SEAT_KEY = "atgrpo_seat"

# (messages, the acting seat) -> (the framework's output for that turn, the reply text the next prompts carry)
Generate = Callable[[list[dict[str, str]], int], Awaitable[tuple[Any, str]]]


def game_spec(game: SeatGame, seed: int) -> dict[str, int]:
    """The plain-data description of one game (it travels in a dataset row): the seed and the SeatGame
    arguments of ``game`` (job.seat_game's, so roll_ma's runs and this one build the same game)."""
    return {
        "seed": seed,
        "players": game.num_players,
        "turns": game.turns,
        "prompt_words": game.prompt_words,
        "relay_reply_chars": game.relay_reply_chars,
    }


def make_game(spec: dict[str, int]) -> SeatGame:
    """The SeatGame ``spec`` describes (not yet reset)."""
    return SeatGame(
        players=int(spec["players"]),
        turns=int(spec["turns"]),
        prompt_words=int(spec["prompt_words"]),
        relay_reply_chars=int(spec["relay_reply_chars"]),
    )


def group_id(prompt_uid: str, turn: int, seat: int) -> str:
    """AT-GRPO's group of a turn's row: the game (the uid verl gave its dataset row, shared by its
    group_size copies), the turn and the seat (agent) that acted. No ``_``: verl's TransferQueue keys are
    ``{uid}_{session}_{index}`` and are split on it; this id is a field of a row, never a key, but keeping
    it free of ``_`` means it can never be mistaken for one."""
    return f"{prompt_uid}/turn{turn}/seat{seat}"


@dataclass
class TurnRow:
    """One turn of a played game: what one training row holds besides the framework's tokens."""

    turn: int
    seat: int
    messages: list[dict[str, str]]  # the prompt SeatGame built (earlier replies carried in relay)
    reply: str  # the decoded reply the game was stepped with
    reward: float  # SeatGame's reward of the acting seat for this reply (gamma 0: the turn's own)
    output: Any  # the framework's output for this turn (verl: an AgentLoopOutput)


async def play(spec: dict[str, int], generate: Generate) -> list[TurnRow]:
    """Play the game of ``spec`` to its end, one ``generate`` call a turn, in turn order (a turn's prompt
    needs every earlier reply; the seat says whose policy answers). Returns one row per turn."""
    game = make_game(spec)
    turn = game.reset(int(spec["seed"]))
    rows: list[TurnRow] = []
    while turn is not None:
        output, reply = await generate(turn.messages, turn.player)
        result = game.step(reply)
        rows.append(
            TurnRow(len(rows), turn.player, turn.messages, reply, result.rewards[turn.player], output)
        )
        turn = result.next_turn
    return rows
