"""The workflow API: what a user's workflow receives and what it returns.

A workflow is plain async Python that calls agents by name, in any order, any number of times:

    from roll_ma.workflows import Workflow, WorkflowResult

    class SolveThenCheck(Workflow):
        agent_names = ("solver", "checker")  # optional: checked against config.agents before the run

        async def run(self, task, agents):
            answer = await agents["solver"].generate([{"role": "user", "content": task["problem"]}])
            verdict = await agents["checker"].generate(
                [{"role": "user", "content": f"{task['problem']} = {answer.text}? Say yes or no."}]
            )
            right = answer.text.strip() == task["answer"]
            return WorkflowResult(
                rewards={"solver": float(right), "checker": [float(("yes" in verdict.text) == right)]},
                metrics={"correct": float(right)},
            )

or an async function ``async def solve(task, agents): ...`` returning the same. ``env.workflow`` names
it (``path/to/file.py:SolveThenCheck`` or ``my_pkg.flows:solve``); ``env.kwargs`` go to the class's
constructor (or to the function as keyword arguments). ``run`` may also take ``tools`` (the tools of
``env.tools``) and ``rng`` (a ``random.Random`` seeded from the episode).

Every ``generate`` call is one training row of that agent (prompt = the chat template of the messages,
response = the sampled tokens, the adapter version the engine used), exactly like a turn of a
turn-based env. Rewards map onto rows by this rule (``roll_ma.workflows.episode.row_rewards``):

- a list for an agent = one reward per call of that agent, in call order: value i goes to the row
  of its i-th call (the length must equal its number of calls);
- a number for an agent = its trajectory reward: it goes to the row of its LAST call. Returns are
  summed back over each agent's own rows (``algorithm.gamma``, 1.0 by default), so with gamma = 1
  every call of the agent is credited the full trajectory reward (plus its later per-turn rewards);
- an agent left out gets 0 on its rows; a reward for an agent that made no call reaches no row
  (it still counts in the episode's returns).

``metrics`` (flat numbers) are averaged over episodes into ``rollout/env/<name>`` (and ``eval/<name>``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Reply:
    """What ``await agents[name].generate(messages)`` returns.

    Attributes:
        text: The decoded response.
        agent: The agent that answered.
        turn: Index of this call among all calls of the episode (the row's ``turn``).
        index: Index of this call among this agent's calls (its place in a per-turn reward list).
        num_tokens: Response length in tokens.
        prompt_truncated: The prompt was cut from the left to fit model.max_prompt_tokens.
    """

    text: str
    agent: str
    turn: int
    index: int
    num_tokens: int
    prompt_truncated: bool = False

    def __str__(self) -> str:
        return self.text


@dataclass
class WorkflowResult:
    """What a workflow returns: rewards per agent (a number per trajectory or a list per call) and metrics."""

    rewards: dict[str, float | list[float]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


class Workflow:
    """Optional base class of class-style workflows (any class with ``async def run`` works).

    Attributes:
        agent_names: The agents this workflow calls; when set, config validation checks that
            ``agents`` defines each of them.
    """

    agent_names: tuple[str, ...] = ()

    async def run(self, task: dict, agents: Mapping[str, Any]) -> WorkflowResult:
        raise NotImplementedError


class WorkflowTruncated(Exception):
    """Raised by ``generate`` when the episode has made ``env.max_turns`` calls: the episode ends as
    truncated (its rows are kept with the rewards it returned, or 0 if it did not return)."""


def as_result(value: Any) -> WorkflowResult:
    """A workflow's return value as a checked ``WorkflowResult`` (TypeError / ValueError on bad ones)."""
    if isinstance(value, Mapping) and not isinstance(value, WorkflowResult):
        unknown = set(value) - {"rewards", "metrics"}
        if unknown:
            raise TypeError(
                f"a workflow returned a dict with keys {sorted(unknown)}; return "
                "WorkflowResult(rewards={agent: reward}, metrics={...}) or a dict of 'rewards' and 'metrics'"
            )
        value = WorkflowResult(dict(value.get("rewards") or {}), dict(value.get("metrics") or {}))
    if not isinstance(value, WorkflowResult):
        raise TypeError(
            f"a workflow returned {type(value).__name__}; return WorkflowResult(rewards={{agent: reward}}, "
            "metrics={...}) (a reward is a number per trajectory or a list with one number per call)"
        )
    rewards: dict[str, float | list[float]] = {}
    for agent, reward in dict(value.rewards).items():
        if isinstance(reward, (list, tuple)):
            rewards[str(agent)] = [_number(r, f"rewards[{agent!r}][{i}]") for i, r in enumerate(reward)]
        else:
            rewards[str(agent)] = _number(reward, f"rewards[{agent!r}]")
    metrics = {str(k): _number(v, f"metrics[{k!r}]") for k, v in dict(value.metrics).items()}
    return WorkflowResult(rewards, metrics)


def _number(value: Any, what: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"workflow {what} must be a number, got {type(value).__name__} {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"workflow {what} must be finite, got {number}")
    return number
