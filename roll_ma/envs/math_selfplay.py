"""Multi-role math self-play: a solver answers, a critic judges, a refiner fixes.

Turn order: `roles` once, then for each extra round the non-solver roles again
(rounds=2 with the default roles: solver, critic, refiner, critic, refiner). A critic
verdict `Correct` ends the episode at once. Every role sees the whole history, rendered
EXACTLY as (a tiny model is pre-trained on this text):

    system: the agent's system prompt
    user:   "Problem: <problem>" + for each earlier turn "\\n<Kind>: <response.strip()>"

e.g. `Problem: 37+48\\nSolver: \\boxed{84}\\nCritic: \\boxed{85} Incorrect`.

Parsing: an answer is the content of the last `\\boxed{...}`; a verdict is the last whole
word `Correct` or `Incorrect` (case-sensitive). A turn whose answer is missing has answer
None, which counts as wrong; "the latest answer" is that of the latest solver/refiner turn.

Rewards (player = index of the agent among the distinct names of `roles`):
- solver, refiner: 1.0 if the answer is correct else 0.0; no `\\boxed{}` -> 0.0 plus
  `format_penalty`.
- critic: 1.0 if its verdict matches the truth of the latest answer before it (`Correct` for a
  right answer, `Incorrect` for a wrong or missing one) else 0.0; no verdict -> 0.0 plus
  `format_penalty`, and the episode goes on as if no verdict was given.
- `share_final_reward`: when the episode ends, every turn of the episode gets +1.0 if the
  final answer (the latest answer) is correct, else +0. The last step's `rewards[p]` carries
  this bonus times the number of turns player p took; `info["turn_rewards"]` of the last step
  lists each turn's full reward (own + bonus) in turn order for per-turn credit assignment.
"""

from __future__ import annotations

import random
import re
from collections import Counter

from roll_ma.envs.base import MultiAgentEnv, StepResult, Turn
from roll_ma.envs.math_verification import (
    MathVerifier,
    as_plain_number,
    extract_boxed,
    get_default_verifier,
    normalize_answer,
)

ROLE_KINDS = ("solver", "critic", "refiner")
DEFAULT_SYSTEM_PROMPTS = {
    "solver": "You are the solver. Put the final answer in \\boxed{}.",
    "critic": "You are the critic. Check the last answer and say Correct or Incorrect.",
    "refiner": "You are the refiner. Fix the answer if needed. Put the final answer in \\boxed{}.",
}
_VERDICT = re.compile(r"\b(Correct|Incorrect)\b")


def extract_verdict(text: object) -> str | None:
    """The last whole word `Correct` or `Incorrect` in `text` (case-sensitive), or None."""
    if not isinstance(text, str):
        return None
    last = None
    for match in _VERDICT.finditer(text):
        last = match.group(1)
    return last


class MathSelfPlayEnv(MultiAgentEnv):
    """Solver / critic / refiner self-play on math problems.

    Args:
        roles: Agent names in turn order (default solver, critic, refiner); the first must be
            a solver. A name used twice is the same player.
        role_kinds: Agent name -> "solver" | "critic" | "refiner" (default: kind = name).
        rounds: 1 = `roles` once; each extra round repeats the non-solver roles.
        system_prompts: Agent name -> system prompt (default: the prompt of its kind).
        share_final_reward: Add the final answer's correctness to every turn (module docstring).
        format_penalty: Added to a turn's reward when its answer or verdict is missing.
        problems: `{"problem", "answer"}` records drawn by seed when `reset` gets no problem;
            default: synthetic arithmetic of `synthetic_level`.
        synthetic_level: Level of the default synthetic problems.
        verifier: A `MathVerifier`; default: the shared one of this process.
        seat_agents: Optional; must equal the distinct names of `roles` when given.
    """

    agent_kinds = ROLE_KINDS

    def __init__(
        self,
        *,
        roles: list[str] | None = None,
        role_kinds: dict[str, str] | None = None,
        rounds: int = 1,
        system_prompts: dict[str, str] | None = None,
        share_final_reward: bool = False,
        format_penalty: float = 0.0,
        problems: list[dict] | None = None,
        synthetic_level: int = 2,
        verifier: MathVerifier | None = None,
        seat_agents: list[str] | None = None,
    ):
        roles = list(roles) if roles is not None else (list(seat_agents) if seat_agents else list(ROLE_KINDS))
        kinds = {name: name for name in roles}
        kinds.update(role_kinds or {})
        for name in roles:
            if kinds[name] not in ROLE_KINDS:
                raise ValueError(
                    f"role {name!r} has kind {kinds[name]!r}, not one of {', '.join(ROLE_KINDS)}; an agent's "
                    "kind is the `kind` of its entry in agents (default: its name)"
                )
        if not roles or kinds[roles[0]] != "solver":
            raise ValueError(f"the first of the roles {roles} must be a solver (an agent of kind solver)")
        if rounds < 1:
            raise ValueError(f"rounds must be >= 1, got {rounds}")
        self.seat_agents = list(dict.fromkeys(roles))
        if seat_agents is not None and list(seat_agents) != self.seat_agents:
            raise ValueError(
                f"the seats {list(seat_agents)} must be the distinct roles in turn order, {self.seat_agents}"
            )
        self.num_players = len(self.seat_agents)
        self.role_kinds = kinds
        self.order = roles + [r for _ in range(rounds - 1) for r in roles if kinds[r] != "solver"]
        self.system_prompts = {
            a: (system_prompts or {}).get(a, DEFAULT_SYSTEM_PROMPTS[kinds[a]]) for a in roles
        }
        self.share_final_reward = bool(share_final_reward)
        self.format_penalty = float(format_penalty)
        self.problems = list(problems) if problems is not None else None
        self.synthetic_level = int(synthetic_level)
        self._verifier = verifier
        self._turns: list[dict] = []
        self._done = True  # why: no episode until reset()

    @property
    def verifier(self) -> MathVerifier:
        if self._verifier is None:
            self._verifier = get_default_verifier()
        return self._verifier

    # ---- the protocol ---------------------------------------------------------------
    def reset(self, seed: int, problem: dict | None = None) -> Turn:
        """Start an episode on `problem` (`{"problem", "answer"}`), or one drawn from `seed`."""
        if problem is None:
            problem = self._draw_problem(int(seed))
        self.problem = str(problem["problem"])
        self.gold = str(problem["answer"])
        self._turns = []
        self._returns = [0.0] * self.num_players
        self._done = False
        self._history = "Problem: " + self.problem
        return self._make_turn()

    def step(self, action_text: str) -> StepResult:
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset(seed) first")
        text = (
            action_text if isinstance(action_text, str) else ("" if action_text is None else str(action_text))
        )
        agent = self.order[len(self._turns)]
        kind = self.role_kinds[agent]
        player = self.seat_agents.index(agent)
        record = {
            "agent": agent,
            "kind": kind,
            "player": player,
            "answer": None,
            "correct": None,
            "verdict": None,
        }
        info: dict = {"kind": kind, "agent": agent, "fallback": False}
        if kind == "critic":
            judged = self._latest_correct()
            verdict = extract_verdict(text)
            record.update(verdict=verdict, judged_correct=judged, format_error=verdict is None)
            reward = 0.0 if verdict is None else float((verdict == "Correct") == judged)
            # the class of the judged answer: lets the trainer balance right vs wrong (a critic facing
            # mostly wrong answers otherwise collapses to always "Incorrect")
            info.update(verdict=verdict, judged_correct=judged, action=verdict,
                        reward_class="judged_right" if judged else "judged_wrong")
        else:
            answer = extract_boxed(text)
            result = self.verifier.verify(answer, self.gold)
            record.update(answer=answer, correct=result.correct, format_error=answer is None)
            record["input_correct"] = self._latest_correct() if self._turns else None
            reward = float(result.correct)
            info.update(answer=answer, correct=result.correct, verify_method=result.method, action=answer)
        if record["format_error"]:
            reward += self.format_penalty
        record["reward"] = reward
        self._turns.append(record)
        self._history += "\n" + kind.capitalize() + ": " + text.strip()
        rewards = [0.0] * self.num_players
        rewards[player] = reward
        self._done = record["verdict"] == "Correct" or len(self._turns) == len(self.order)
        info["format_error"] = record["format_error"]
        if self._done:
            info.update(self._finish(rewards))
        for i, r in enumerate(rewards):
            self._returns[i] += r
        return StepResult(rewards, self._done, info, None if self._done else self._make_turn())

    def episode_returns(self) -> list[float]:
        return list(self._returns)

    def episode_metrics(self) -> dict[str, float]:
        answers = [t for t in self._turns if t["kind"] != "critic"]
        critics = [t for t in self._turns if t["kind"] == "critic" and t["verdict"] is not None]
        refiners = [t for t in answers if t["kind"] == "refiner"]
        m = {
            "turns": float(len(self._turns)),
            "format_errors": float(sum(t["format_error"] for t in self._turns)),
            "ended_early": float(len(self._turns) < len(self.order)),
            "correct_turn1": float(bool(answers and answers[0]["correct"])),
            "correct_final": float(self._latest_correct()),
            "majority_correct": float(_majority_correct(answers)),
            "critic_tp": float(sum(t["verdict"] == "Incorrect" and not t["judged_correct"] for t in critics)),
            "critic_fp": float(sum(t["verdict"] == "Incorrect" and t["judged_correct"] for t in critics)),
            "critic_fn": float(sum(t["verdict"] == "Correct" and not t["judged_correct"] for t in critics)),
            "critic_tn": float(sum(t["verdict"] == "Correct" and t["judged_correct"] for t in critics)),
            "critic_no_verdict": float(
                sum(t["kind"] == "critic" and t["verdict"] is None for t in self._turns)
            ),
            "refiner_wrong_inputs": float(sum(not t["input_correct"] for t in refiners)),
            "refiner_right_inputs": float(sum(bool(t["input_correct"]) for t in refiners)),
            "refiner_fixed": float(sum(not t["input_correct"] and t["correct"] for t in refiners)),
            "refiner_broke": float(sum(bool(t["input_correct"]) and not t["correct"] for t in refiners)),
        }
        return m

    def builtin_action(self, policy: str, rng: random.Random) -> str:
        """Built-in players: "scripted" = an oracle (right answer, right verdict), "random" = a guess."""
        kind = self.role_kinds[self.order[len(self._turns)]]
        if policy == "scripted":
            if kind == "critic":
                return "Correct" if self._latest_correct() else "Incorrect"
            return "\\boxed{" + self.gold + "}"
        if policy == "random":
            if kind == "critic":
                return rng.choice(["Correct", "Incorrect"])
            value = as_plain_number(self.gold)
            guess = self.gold if value is None or rng.random() < 0.5 else str(value + rng.choice([-1, 1]))
            return "\\boxed{" + guess + "}"
        raise ValueError(f"Unknown built-in policy {policy!r}; use 'random' or 'scripted'")

    # ---- helpers ----------------------------------------------------------------------
    @property
    def history_text(self) -> str:
        """The shared history every role sees as its user message."""
        return self._history

    @property
    def turn_records(self) -> list[dict]:
        """Per-turn records of the episode (agent, kind, answer, correct, verdict, reward...)."""
        return [dict(t) for t in self._turns]

    def _draw_problem(self, seed: int) -> dict:
        rng = random.Random(f"math-selfplay:{seed}")
        if self.problems:
            return self.problems[rng.randrange(len(self.problems))]
        from roll_ma.data.synthetic import arithmetic_problem

        return arithmetic_problem(rng, self.synthetic_level)

    def _latest_correct(self) -> bool:
        for t in reversed(self._turns):
            if t["kind"] != "critic":
                return bool(t["correct"])
        return False

    def _finish(self, rewards: list[float]) -> dict:
        final_correct = self._latest_correct()
        turn_rewards = [t["reward"] for t in self._turns]
        if self.share_final_reward:
            bonus = float(final_correct)
            turn_rewards = [r + bonus for r in turn_rewards]
            for t in self._turns:
                rewards[t["player"]] += bonus
        return {"final_correct": final_correct, "turn_rewards": turn_rewards}

    def _make_turn(self) -> Turn:
        agent = self.order[len(self._turns)]
        messages = [
            {"role": "system", "content": self.system_prompts[agent]},
            {"role": "user", "content": self._history},
        ]
        return Turn(player=self.seat_agents.index(agent), agent=agent, messages=messages, legal_actions=[])


def _majority_correct(answer_turns: list[dict]) -> bool:
    """Majority vote over the answers given; ties go to the latest given answer.

    Answers are grouped by their plain-number value or else their normalised text (not by
    math equivalence: `0.5` and `\\frac{1}{2}` are two groups). Missing answers do not vote.
    """
    keys, verdicts = [], {}
    for t in answer_turns:
        if t["answer"] is None:
            continue
        value = as_plain_number(t["answer"])
        key = f"n:{value.normalize()}" if value is not None else "t:" + normalize_answer(t["answer"])
        keys.append(key)
        verdicts[key] = bool(t["correct"])
    if not keys:
        return False
    counts = Counter(keys)
    last_seen = {k: i for i, k in enumerate(keys)}
    winner = max(counts, key=lambda k: (counts[k], last_seen[k]))
    return verdicts[winner]
