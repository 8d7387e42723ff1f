"""A user-style env, named by import path in the tests' configs (``toy_envs:DigitGame``).

Its reward (the share of digit characters in a reply) varies for any model, even a random
one, so every learning agent gets a non-zero advantage and its adapter must change.
"""

import random

from roll_ma.envs.base import MultiAgentEnv, StepResult, Turn


class DigitGame(MultiAgentEnv):
    def __init__(self, *, seat_agents=None, players: int = 2, rounds: int = 1):
        self.num_players = players
        self.seat_agents = list(seat_agents) if seat_agents else [f"agent{i}" for i in range(players)]
        self.rounds = rounds

    def reset(self, seed: int) -> Turn:
        self.seed, self.t, self.returns = seed, 0, [0.0] * self.num_players
        return self._turn()

    def _turn(self) -> Turn:
        p = self.t % self.num_players
        msgs = [
            {"role": "system", "content": "Say digits."},
            {"role": "user", "content": f"Seed {self.seed} turn {self.t}"},
        ]
        return Turn(player=p, agent=self.seat_agents[p], messages=msgs)

    def step(self, action_text: str) -> StepResult:
        p = self.t % self.num_players
        text = action_text or ""
        reward = sum(c.isdigit() for c in text) / max(1, len(text))
        rewards = [0.0] * self.num_players
        rewards[p] = reward
        self.returns[p] += reward
        self.t += 1
        done = self.t >= self.num_players * self.rounds
        return StepResult(
            rewards,
            done,
            {"format_error": False, "action": text, "fallback": False},
            None if done else self._turn(),
        )

    def episode_returns(self):
        return list(self.returns)

    def episode_metrics(self):
        return {"digit_share": sum(self.returns) / (self.num_players * self.rounds)}

    def builtin_action(self, policy, rng: random.Random) -> str:
        return str(rng.randint(0, 9))


class StuckGame(DigitGame):
    """DigitGame whose first move never returns: a worker stuck for good (a deadlock, a dead file system)."""

    def step(self, action_text: str) -> StepResult:
        import threading

        threading.Event().wait()  # nothing ever sets it
        raise AssertionError("unreachable")
