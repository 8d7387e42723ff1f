"""The multi-agent environment protocol: turn-based, text in, text out.

An episode is a sequence of turns. At every turn exactly one seat (player) acts: the env
hands out a `Turn` (who acts, what they see, what they may do), the caller generates text
with that seat's agent (or asks `builtin_action` for a built-in opponent), and feeds the raw
text back to `step`, which parses it, applies it and returns a `StepResult`.

This module imports nothing heavy: envs are plain Python so that they run unchanged in a
test, a notebook or a Ray actor.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from roll_ma.algorithms.game_tree import GameTree, InfoSet

# Names of the built-in policies a seat may be given instead of a learning agent.
BUILTIN_POLICIES = ("random", "scripted")


@dataclass
class Turn:
    """What the acting seat sees at one turn.

    Attributes:
        player: Seat index of the acting player (0..num_players-1).
        agent: Agent name acting in that seat (from `seat_agents`), or a built-in policy name
            ("random", "scripted") that the caller resolves through `builtin_action`.
        messages: Chat messages `[{"role": "system"|"user", "content": str}]` for the agent.
        legal_actions: Legal action strings (games); `[]` for free-form text (math).
        action_responses: The answer a well-behaved model writes to choose each legal action
            (same order as `legal_actions`); what the action entropy bonus scores.
        prompt_ids: The prompt as token ids, when the env builds it itself (team envs with prompt
            hooks); None: the env worker chat-templates `messages`.
    """

    player: int
    agent: str
    messages: list[dict]
    legal_actions: list[str] = field(default_factory=list)
    action_responses: list[str] = field(default_factory=list)
    prompt_ids: list[int] | None = None


@dataclass
class StepResult:
    """The outcome of one `step`.

    Attributes:
        rewards: Reward of each player for this step (len num_players); the actor's format
            penalty is already included.
        done: True when the episode is over.
        info: At least "format_error" (bool), "action" (the applied action string or None) and
            "fallback" (bool: the configured fallback was used because the output did not
            parse); envs add their own keys (math: "answer", "correct", "verdict").
        next_turn: The next turn, or None when done.
    """

    rewards: list[float]
    done: bool
    info: dict
    next_turn: Turn | None


class MultiAgentEnv(ABC):
    """Base class of every roll_ma env.

    Subclasses take their config as keyword arguments plus `seat_agents` (the agent name of
    each seat). The same seed and the same action texts must give the same episode.

    Attributes:
        num_players: Number of seats.
        seat_agents: Agent name per seat.
        has_action_choices: Whether turns fill `Turn.action_responses` (games with legal actions).
        shows_greedy_moves: Whether the env takes `show_greedy_moves=True` and then uses the
            `greedy_text` of `step` (the mover's greedy answer) in what the other players see.
        agent_kinds: Role-based envs: the kinds an agent may have (its `kind` in the config,
            default its name); empty: agents have no kinds.
    """

    num_players: int
    seat_agents: list[str]
    # why: config validation refuses study.action_entropy_coef for envs whose turns list no actions
    has_action_choices: bool = False
    # why: config validation refuses env.show_greedy_moves for envs that would ignore it
    shows_greedy_moves: bool = False
    # why: config validation names the agent whose kind the env does not know (agents[i].kind)
    agent_kinds: tuple[str, ...] = ()
    # why: envs that build prompts from token ids (team envs) also get the response's ids in `step`
    takes_response_ids: bool = False

    @abstractmethod
    def reset(self, seed: int) -> Turn:
        """Start a new episode from `seed` and return its first turn."""

    @abstractmethod
    def step(self, action_text: str) -> StepResult:
        """Apply the raw model text of the acting player. Never raises on bad text.

        Envs with `shows_greedy_moves` also take ``greedy_text=``: what the mover's policy
        answers greedily (the caller passes it only when env.show_greedy_moves is on).
        """

    @abstractmethod
    def episode_returns(self) -> list[float]:
        """Total return per player of the episode so far, penalties included."""

    @abstractmethod
    def episode_metrics(self) -> dict[str, float]:
        """Env-specific metrics of the current episode (flat, float values)."""

    @abstractmethod
    def builtin_action(self, policy: str, rng: random.Random) -> str:
        """A model-like text chosen by a built-in policy ("random", "scripted") for this turn."""

    def planned_turns(self) -> list[Turn] | None:
        """The turns that will follow the current one, for envs whose prompts never depend on a reply
        (fixed by the seed): the env worker then decodes them in the same generate call as the current
        turn, and checks each against what `step` returns. None (the default): turns depend on
        replies and are decoded one round at a time.
        """
        return None


@runtime_checkable
class GameTreeEnv(Protocol):
    """An env whose whole game can be enumerated: joint policy search (``study.joint_search_every``)."""

    def game_tree(self) -> tuple[GameTree, dict[InfoSet, Turn]]:
        """The terminal paths and the turn of every information set (see ``OpenSpielEnv.game_tree``)."""
        ...


def check_seat_agents(seat_agents: list[str] | None, num_players: int, env_name: str) -> list[str]:
    """Validate `seat_agents` against the number of seats; default: one agent per seat.

    Args:
        seat_agents: Agent name per seat, or None for `agent0..agentN-1`.
        num_players: Number of seats of the env.
        env_name: Used in the error message.

    Returns:
        The list of agent names, one per seat.
    """
    if seat_agents is None:
        return [f"agent{i}" for i in range(num_players)]
    seat_agents = [str(a) for a in seat_agents]
    if len(seat_agents) != num_players:
        raise ValueError(
            f"{env_name} has {num_players} seats but {len(seat_agents)} agent names are given for them "
            f"({seat_agents}); give one agent name per seat (repeat a name to share an agent)."
        )
    return seat_agents
