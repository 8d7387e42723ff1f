"""SeatGame: the synthetic N-agent env of the pipeline benchmarks (imported by Ray actors by path)."""

from __future__ import annotations

import random

from roll_ma.envs.base import MultiAgentEnv, StepResult, Turn

FILLER = "the quick brown fox jumps over the lazy dog".split()


class SeatGame(MultiAgentEnv):
    """N seats, each its own agent, acting in turn for ``turns`` turns; a turn's reward is the share of
    digits in the reply (varies for any model, so every agent gets a nonzero advantage).

    Seat (seed + t) mod N acts at turn t: episodes of different seeds start at different seats, so
    every agent gets rows even when an episode has fewer turns than there are agents, and every
    round's generate call mixes the agents' adapters as a real multi-agent batch does.

    Args:
        seat_agents: agent name per seat.
        players: seats N.
        turns: turns per episode.
        prompt_words: filler words in each prompt (sets the prompt length).
        relay_reply_chars: 0 (default): a turn's prompt depends only on (seed, turn), so every later turn
            is known at once (``planned_turns``). > 0, the relay game: a turn's prompt also carries the
            last ``relay_reply_chars`` characters of every earlier turn's reply, as a game whose agents
            answer each other does (a critic reading the solver); no turn can then be planned.
    """

    def __init__(
        self,
        *,
        seat_agents=None,
        players: int = 2,
        turns: int = 8,
        prompt_words: int = 16,
        relay_reply_chars: int = 0,
    ):
        self.num_players = players
        self.seat_agents = list(seat_agents) if seat_agents else [f"agent{i}" for i in range(players)]
        self.turns = turns
        self.prompt_words = prompt_words
        self.relay_reply_chars = relay_reply_chars

    def reset(self, seed: int) -> Turn:
        self.seed, self.t, self.returns = seed, 0, [0.0] * self.num_players
        self.replies: list[str] = []
        return self._turn(0)

    def _seat(self, t: int) -> int:
        return (self.seed + t) % self.num_players

    def _turn(self, t: int) -> Turn:
        p = self._seat(t)
        words = " ".join(FILLER[(self.seed + i) % len(FILLER)] for i in range(self.prompt_words))
        text = f"Game {self.seed}, turn {t}: {words}"
        if self.relay_reply_chars:
            text += "".join(
                f"\nseat {self._seat(k)} said: {reply[-self.relay_reply_chars :]}"
                for k, reply in enumerate(self.replies)
            )
        msgs = [
            {"role": "system", "content": f"You are seat {p} of {self.num_players}. Say digits."},
            {"role": "user", "content": text},
        ]
        return Turn(player=p, agent=self.seat_agents[p], messages=msgs)

    def planned_turns(self) -> list[Turn] | None:
        """A turn's prompt depends only on (seed, turn): every later turn is known now (not in the relay
        game, whose prompts carry the replies)."""
        if self.relay_reply_chars:
            return None
        return [self._turn(t) for t in range(self.t + 1, self.turns)]

    def step(self, action_text: str) -> StepResult:
        p = self._seat(self.t)
        text = action_text or ""
        rewards = [0.0] * self.num_players
        rewards[p] = sum(c.isdigit() for c in text) / max(1, len(text))
        self.returns[p] += rewards[p]
        self.replies.append(text)
        self.t += 1
        done = self.t >= self.turns
        info = {"format_error": False, "action": text, "fallback": False}
        return StepResult(rewards, done, info, None if done else self._turn(self.t))

    def episode_returns(self) -> list[float]:
        return list(self.returns)

    def episode_metrics(self) -> dict[str, float]:
        return {"digit_share": sum(self.returns) / self.turns}

    def builtin_action(self, policy: str, rng: random.Random) -> str:
        return str(rng.randint(0, 9))
