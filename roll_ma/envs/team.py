"""``marft``: a team of agents that speak in turn on one task (MARFT's Reasoner -> Actor).

Each round every agent speaks once, in config order (the env's seats). An agent's prompt comes
from its hooks (``roll_ma/envs/team_hooks.py``): ``pre_process`` turns the team context (what the
agents before it left) and the task's observation into its prompt ids; ``post_process`` turns its
response into the context the next agent reads. After the round's last agent, the task
(``env.path``, default ``envs/team_math.py:MathTask``) grades the round: ``step(actions,
ground_truth) -> (obs, reward, done)``; the reward goes to the round's last agent (team reward
reaches the others through ``algorithm.share_reward_in_agent``). The episode ends when the task
says done or after ``env.max_assistant_turns`` agent turns.

Prompts are token ids (``Turn.prompt_ids``), so the env worker passes the tokenizer in and the
response ids back (``takes_response_ids``).
"""

from __future__ import annotations

import random
from numbers import Real
from typing import Any

from roll_ma.envs.base import MultiAgentEnv, StepResult, Turn
from roll_ma.envs.team_hooks import AgentHooks, load_hooks
from roll_ma.errors import UserCodeError

DEFAULT_TASK = "roll_ma.envs.team_math:MathTask"


TASK_PROTOCOL = ("reset(problem) -> obs: str; step(actions, ground_truth) -> (obs: str, reward: float, "
                 "done: bool)")


class TaskError(UserCodeError):
    """The task (env.path) raised or returned something of the wrong type."""


def load_task_class(spec: str | None) -> type:
    """The task class ``env.path`` names ('path/to/file.py:Class' or 'pkg.module:Class'); ValueError if
    the file, module or class is missing or lacks reset / step."""
    from roll_ma.registry import load_target, module_location

    spec = spec or DEFAULT_TASK
    try:
        module, cls = load_target(spec)
    except ValueError as err:
        raise ValueError(f"env.path {spec!r}: {err}") from err
    lacking = [m for m in ("reset", "step") if not callable(getattr(cls, m, None))]
    if lacking:
        name, where = getattr(cls, "__name__", spec), module_location(module)
        raise ValueError(f"env.path {spec!r}: {name} in {where} has no {' / '.join(lacking)}; a task has "
                         "reset(problem) -> obs and step(actions, ground_truth) -> (obs, reward, done)")
    return cls


class TeamEnv(MultiAgentEnv):
    """Agents speaking in turn on a task; see the module docstring.

    Args:
        agent_configs: every agent's config in order (their hooks: process, kwargs, obs_with_env).
        task_path: ``env.path`` (None: the built-in math task).
        max_assistant_turns: agent turns per episode, a multiple of the team size (None: one round).
        tokenizer: the model's tokenizer (the env worker gives it; config checks build the env without).
        vocab_size: the model's vocabulary size (the env worker gives it): hooks must return ids below it.
        seat_agents: agent name per seat (default: the agents in order).
        problems, synthetic_level: where ``reset`` draws a problem when it gets none.
        **task_kwargs: ``env.kwargs``, the task's constructor arguments.
    """

    takes_response_ids = True

    def __init__(self, *, agent_configs: list[Any] | None = None, task_path: str | None = None,
                 max_assistant_turns: int | None = None, tokenizer: Any = None, vocab_size: int | None = None,
                 seat_agents: list[str] | None = None, problems: list[dict] | None = None,
                 synthetic_level: int = 2, **task_kwargs: Any):
        configs = list(agent_configs or [])
        names = [a.name for a in configs]
        self.seat_agents = list(seat_agents) if seat_agents is not None else names
        if not self.seat_agents:
            raise ValueError("the marft env needs the agents (agent_configs) or seat_agents")
        self.num_players = len(self.seat_agents)
        by_name = {a.name: a for a in configs}
        self.hooks: dict[str, AgentHooks] = {
            n: load_hooks(by_name[n]) if n in by_name else AgentHooks(n) for n in self.seat_agents}
        for hooks in self.hooks.values():
            hooks.vocab_size = vocab_size
        turns = max_assistant_turns or self.num_players
        if turns % self.num_players:
            raise ValueError(f"env.max_assistant_turns={turns} is not a multiple of the team size "
                             f"{self.num_players} (every round each agent speaks once)")
        self.max_turns = turns
        self.task_spec = task_path or DEFAULT_TASK
        self.task = load_task_class(task_path)(**task_kwargs)
        self.tokenizer = tokenizer
        self.problems, self.synthetic_level = problems, synthetic_level
        self._done = True

    # ---- the protocol ---------------------------------------------------------------
    def reset(self, seed: int, problem: dict | None = None) -> Turn:
        if self.tokenizer is None:
            raise RuntimeError("the marft env builds prompts from token ids: construct it with tokenizer=")
        if problem is None:
            problem = self._draw_problem(int(seed))
        self.ground_truth = str(problem.get("answer", ""))
        self.obs = self._check_obs(self._task_call("reset", problem), "reset")
        self.context: list[int] = []
        self.turns, self.rounds = 0, 0
        self.round_actions: dict[str, str] = {}
        self.rewards: list[float] = []
        self.returns = [0.0] * self.num_players
        self._done = False
        return self._make_turn()

    def step(self, action_text: str, response_ids: list[int] | None = None) -> StepResult:
        if self._done:
            raise RuntimeError("step() called on a finished episode; call reset(seed) first")
        agent = self.seat_agents[self.turns % self.num_players]
        text = action_text if isinstance(action_text, str) else str(action_text or "")
        ids = (list(response_ids) if response_ids is not None
               else self.tokenizer.encode(text, add_special_tokens=False))
        self.context = self.hooks[agent].context_after(self.tokenizer, self.context, ids)
        self.round_actions[agent] = text
        self.turns += 1
        rewards = [0.0] * self.num_players
        done = False
        if self.turns % self.num_players == 0:  # the round is complete: the task grades it
            obs, reward, done = self._check_step(self._task_call("step", dict(self.round_actions),
                                                                 self.ground_truth))
            rewards[self.num_players - 1] = reward
            self.rewards.append(reward)
            self.obs, self.round_actions = obs, {}
            self.rounds += 1
        done = bool(done) or self.turns >= self.max_turns
        for p, r in enumerate(rewards):
            self.returns[p] += r
        self._done = done
        info = {"format_error": False, "action": text, "fallback": False}
        return StepResult(rewards, done, info, None if done else self._make_turn())

    def episode_returns(self) -> list[float]:
        return list(self.returns)

    def episode_metrics(self) -> dict[str, float]:
        out = {"team_reward": self.rewards[-1] if self.rewards else 0.0, "rounds": float(self.rounds),
               "turns": float(self.turns)}
        extra = getattr(self.task, "metrics", None)
        if callable(extra):
            values = self._task_call("metrics")
            if not isinstance(values, dict):
                shown = f"{type(values).__name__} {values!r}"
                raise self._wrong_return("metrics", shown, "a dict of numbers")
            out.update({str(k): float(v) for k, v in values.items()})
        return out

    @staticmethod
    def aggregate_metrics(per_episode: list[dict]) -> dict[str, float]:
        """Evaluation: the mean of every episode metric (team_reward, the task's correct, ...)."""
        keys = sorted({k for m in per_episode for k in m})
        return {k: sum(float(m.get(k, 0.0)) for m in per_episode) / max(len(per_episode), 1) for k in keys}

    def builtin_action(self, policy: str, rng: random.Random) -> str:
        raise ValueError("the marft env has no built-in players; every seat is an agent")

    # ---- helpers ----------------------------------------------------------------------
    def _make_turn(self) -> Turn:
        agent = self.seat_agents[self.turns % self.num_players]
        obs_ids = self.tokenizer.encode(self.obs, add_special_tokens=False) if self.obs else []
        prompt_ids = self.hooks[agent].prompt(self.tokenizer, self.context, obs_ids)
        messages = [{"role": "user", "content": self.tokenizer.decode(prompt_ids)}]  # for logs only
        return Turn(player=self.turns % self.num_players, agent=agent, messages=messages,
                    prompt_ids=prompt_ids)

    def _task_call(self, method: str, *args: Any) -> Any:
        from roll_ma.error_report import raise_location

        fn = getattr(self.task, method)
        try:
            return fn(*args)
        except Exception as err:
            file = getattr(getattr(fn, "__code__", None), "co_filename", None)
            raise TaskError(f"the task {self.task_spec} (env.path): {method}() raised {type(err).__name__}: "
                            f"{err}", raise_location(err, file),
                            f"correct {method}() at that line (the log file has the full traceback); a task "
                            f"has {TASK_PROTOCOL}") from err

    def _wrong_return(self, method: str, shown: str, expected: str) -> TaskError:
        from roll_ma.error_report import code_location

        return TaskError(f"the task {self.task_spec} (env.path): {method}() returned {shown}; it must return "
                         f"{expected}", code_location(getattr(self.task, method)),
                         f"make {method}() return {expected}")

    def _check_obs(self, obs: Any, method: str) -> str:
        if not isinstance(obs, str):
            raise self._wrong_return(method, f"{type(obs).__name__} {obs!r} as the observation", "a str")
        return obs

    def _check_step(self, out: Any) -> tuple[str, float, bool]:
        ok = (isinstance(out, tuple) and len(out) == 3 and isinstance(out[1], Real)
              and isinstance(out[2], (bool, int)))
        if not ok:
            raise self._wrong_return("step", repr(out), "(obs: str, reward: float, done: bool)")
        return self._check_obs(out[0], "step"), float(out[1]), bool(out[2])

    def _draw_problem(self, seed: int) -> dict:
        rng = random.Random(f"marft:{seed}")
        if self.problems:
            return self.problems[rng.randrange(len(self.problems))]
        from roll_ma.data.synthetic import arithmetic_problem

        return arithmetic_problem(rng, self.synthetic_level)
