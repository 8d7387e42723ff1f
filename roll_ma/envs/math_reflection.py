"""Multi-agent reflection on math: an actor answers, a critic reviews the latest answer, the actor refines.

Turn order, for ``max_rounds`` = K: actor, critic, actor, critic, ..., actor: K answers (the first
answer and K - 1 refinements) and K - 1 critiques. Every episode runs all K rounds, so the metrics
of ``roll_ma.envs.reflection_metrics`` (``p1@t1``, ``m1@tK``, ``p1@tK``) are always over K answers.

What each turn sees (``history="last"``, the default: only the latest answer and feedback, so
prompts stay short and look alike in every round; ``"full"``: the whole history, as math self-play):

    actor, first answer:  system: answer prompt;   user: "Problem: <p>"
    critic:               system: critique prompt; user: "Problem: <p>\\nSolver: <latest answer>"
    actor, refinement:    system: refine prompt;
                          user: "Problem: <p>\\nSolver: <latest answer>\\nCritic: <latest critique>"

(the prompts and labels of math self-play, which the built-in tiny model was pre-trained on).

An answer is the content of the last ``\\boxed{...}``; a critique is free text (its verdict, the
last whole word ``Correct`` / ``Incorrect``, is recorded when present). Rewards: an answer earns 1.0
if right (plus ``format_penalty`` when it has no box); a critique earns 1.0 if the refinement that
follows it is right (credited when the actor answers).

Branches: ``reset(seed, problem)`` may start from a given state, ``problem["history"]`` (the texts
of the turns already played, in turn order) and play ``problem["horizon"]`` turns from there. The
pipeline builds DPO pairs from such branches (``pipelines/phases/reflection_data.py``): every branch of
one state shares the first mover's context exactly. ``branch_success`` in the episode metrics is
whether the first answer given after the start is right.
"""

from __future__ import annotations

import random

from roll_ma.envs.base import MultiAgentEnv, StepResult, Turn
from roll_ma.envs.math_selfplay import DEFAULT_SYSTEM_PROMPTS, extract_verdict
from roll_ma.envs.math_verification import MathVerifier, as_plain_number, extract_boxed, get_default_verifier
from roll_ma.envs.reflection_metrics import aggregate_reflection_metrics, episode_reflection_metrics

TURN_KINDS = ("answer", "critique", "refine")
DEFAULT_PROMPTS = {
    "answer": DEFAULT_SYSTEM_PROMPTS["solver"],
    "critique": DEFAULT_SYSTEM_PROMPTS["critic"],
    "refine": DEFAULT_SYSTEM_PROMPTS["refiner"],
}


class MathReflectionEnv(MultiAgentEnv):
    """Actor / critic reflection on math problems (module docstring).

    ``supports_branching``: ``reset`` starts from a given history (DPO pairs, teacher data).

    Args:
        roles: The two agent names, actor first (default ``["actor", "critic"]``).
        max_rounds: Answers per episode (the first and the refinements), >= 1.
        history: ``"last"`` (latest answer and critique only) or ``"full"``.
        system_prompts: Agent name -> system prompt of all its turns (default: per turn kind).
        format_penalty: Added to an answer's reward when it has no ``\\boxed{}``.
        problems: ``{"problem", "answer"}`` records drawn by seed when ``reset`` gets no problem;
            default: synthetic arithmetic of ``synthetic_level``.
        synthetic_level: Level of the default synthetic problems.
        verifier: A ``MathVerifier``; default: the shared one of this process.
        seat_agents: Optional; must equal ``roles`` when given.
    """

    supports_branching = True

    def __init__(
        self,
        *,
        roles: list[str] | None = None,
        max_rounds: int = 5,
        history: str = "last",
        system_prompts: dict[str, str] | None = None,
        format_penalty: float = 0.0,
        problems: list[dict] | None = None,
        synthetic_level: int = 2,
        verifier: MathVerifier | None = None,
        seat_agents: list[str] | None = None,
    ):
        roles = (
            list(roles) if roles is not None else (list(seat_agents) if seat_agents else ["actor", "critic"])
        )
        if len(roles) != 2 or roles[0] == roles[1]:
            raise ValueError(f"roles must name two different agents, actor then critic; got {roles}")
        if seat_agents is not None and list(seat_agents) != roles:
            raise ValueError(f"the seats {list(seat_agents)} must be the roles {roles} (actor, then critic)")
        if int(max_rounds) < 1:
            raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
        if history not in ("last", "full"):
            raise ValueError(f"history must be 'last' or 'full', got {history!r}")
        self.seat_agents = roles
        self.num_players = 2
        self.max_rounds = int(max_rounds)
        self.history = history
        self.system_prompts = dict(system_prompts or {})
        self.format_penalty = float(format_penalty)
        self.problems = list(problems) if problems is not None else None
        self.synthetic_level = int(synthetic_level)
        self._verifier = verifier
        self._turns: list[dict] = []
        self._done = True

    @property
    def verifier(self) -> MathVerifier:
        if self._verifier is None:
            self._verifier = get_default_verifier()
        return self._verifier

    @property
    def total_turns(self) -> int:
        return 2 * self.max_rounds - 1

    # ---- the protocol ---------------------------------------------------------------
    def reset(self, seed: int, problem: dict | None = None) -> Turn:
        """Start on ``problem`` (or one drawn from ``seed``), from its ``history`` if it has one."""
        if problem is None:
            problem = self._draw_problem(int(seed))
        self.problem, self.gold = str(problem["problem"]), str(problem["answer"])
        history = [str(t) for t in problem.get("history") or []]
        if len(history) >= self.total_turns:
            raise ValueError(
                f"a start history of {len(history)} turns leaves nothing to play "
                f"(max_rounds={self.max_rounds}: {self.total_turns} turns)"
            )
        horizon = problem.get("horizon")
        self._end = (
            self.total_turns if horizon is None else min(self.total_turns, len(history) + int(horizon))
        )
        self._turns, self._start = [], len(history)
        self._returns = [0.0, 0.0]
        self._done = False
        for text in history:  # the given turns: recorded, not rewarded
            self._record(text)
        return self._make_turn()

    def step(self, action_text: str) -> StepResult:
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset(seed) first")
        text = (
            action_text if isinstance(action_text, str) else ("" if action_text is None else str(action_text))
        )
        record = self._record(text)
        rewards = [0.0, 0.0]
        info: dict = {
            "kind": record["kind"],
            "agent": self.seat_agents[record["player"]],
            "fallback": False,
            "format_error": record["format_error"],
        }
        if record["kind"] == "critique":
            info.update(action=record["verdict"], verdict=record["verdict"])
        else:
            rewards[0] = float(record["correct"]) + (self.format_penalty if record["format_error"] else 0.0)
            if record["kind"] == "refine" and len(self._turns) - 2 >= self._start:  # its critique was played
                rewards[1] = float(record["correct"])
            info.update(action=record["answer"], answer=record["answer"], correct=record["correct"])
        record["reward"] = rewards[record["player"]]
        self._done = len(self._turns) >= self._end
        for i, r in enumerate(rewards):
            self._returns[i] += r
        return StepResult(rewards, self._done, info, None if self._done else self._make_turn())

    def episode_returns(self) -> list[float]:
        return list(self._returns)

    def episode_metrics(self) -> dict[str, float]:
        answers = [t for t in self._turns if t["kind"] != "critique"]
        m = episode_reflection_metrics(
            [t["answer"] for t in answers], [t["correct"] for t in answers], self.max_rounds
        )
        played = self._turns[self._start :]
        m["turns"] = float(len(played))
        m["format_errors"] = float(sum(t["format_error"] for t in played))
        first_new = next((t for t in played if t["kind"] != "critique"), None)
        if first_new is not None:
            m["branch_success"] = float(first_new["correct"])
        return m

    @staticmethod
    def aggregate_metrics(episodes: list[dict[str, float]]) -> dict[str, float]:
        """What evaluation reports for this env (``reflection_metrics``)."""
        return aggregate_reflection_metrics(episodes)

    def builtin_action(self, policy: str, rng: random.Random) -> str:
        """Built-in players: "scripted" = an oracle, "random" = a guess (right half the time)."""
        kind = self._next_kind()
        latest = self._latest_answer()
        if policy == "scripted":
            if kind == "critique":
                return f"{self.problem}={self.gold} " + (
                    "Correct" if latest and latest["correct"] else "Incorrect"
                )
            return "\\boxed{" + self.gold + "}"
        if policy == "random":
            if kind == "critique":
                return rng.choice(["Correct", "Incorrect"])
            value = as_plain_number(self.gold)
            guess = self.gold if value is None or rng.random() < 0.5 else str(value + rng.choice([-1, 1]))
            return "\\boxed{" + guess + "}"
        raise ValueError(f"Unknown built-in policy {policy!r}; use 'random' or 'scripted'")

    # ---- helpers ----------------------------------------------------------------------
    @property
    def turn_records(self) -> list[dict]:
        """Every turn of the episode, the given history included (kind, text, answer, correct, verdict)."""
        return [dict(t) for t in self._turns]

    def _next_kind(self) -> str:
        n = len(self._turns)
        return "critique" if n % 2 else ("answer" if n == 0 else "refine")

    def _record(self, text: str) -> dict:
        kind = self._next_kind()
        record = {
            "kind": kind,
            "player": 1 if kind == "critique" else 0,
            "text": text,
            "answer": None,
            "correct": None,
            "verdict": None,
            "format_error": False,
            "reward": 0.0,
        }
        if kind == "critique":
            record["verdict"] = extract_verdict(text)
        else:
            answer = extract_boxed(text)
            record.update(
                answer=answer,
                correct=self.verifier.verify(answer, self.gold).correct,
                format_error=answer is None,
            )
        self._turns.append(record)
        return record

    def _latest_answer(self) -> dict | None:
        return next((t for t in reversed(self._turns) if t["kind"] != "critique"), None)

    def _draw_problem(self, seed: int) -> dict:
        rng = random.Random(f"math-reflection:{seed}")
        if self.problems:
            return self.problems[rng.randrange(len(self.problems))]
        from roll_ma.data.synthetic import arithmetic_problem

        return arithmetic_problem(rng, self.synthetic_level)

    def _user_text(self, kind: str) -> str:
        lines = ["Problem: " + self.problem]
        if self.history == "full":
            labels = {"answer": "Solver", "critique": "Critic", "refine": "Refiner"}
            lines += [f"{labels[t['kind']]}: {t['text'].strip()}" for t in self._turns]
        elif kind != "answer":
            latest = self._latest_answer()
            assert latest is not None, "a critique or a refinement follows an answer"
            lines.append("Solver: " + latest["text"].strip())
            if kind == "refine":
                lines.append("Critic: " + self._turns[-1]["text"].strip())
        return "\n".join(lines)

    def _make_turn(self) -> Turn:
        kind = self._next_kind()
        player = 1 if kind == "critique" else 0
        agent = self.seat_agents[player]
        system = self.system_prompts.get(agent, DEFAULT_PROMPTS[kind])
        messages = [{"role": "system", "content": system}, {"role": "user", "content": self._user_text(kind)}]
        return Turn(player=player, agent=agent, messages=messages, legal_actions=[])
