"""One workflow episode: the agent handles it hands the workflow, its rows, its rewards and its failure.

``play_episode`` runs the user's workflow once on a task with one ``AgentHandle`` per agent. Every
``generate`` call becomes a ``TurnSample`` (the turn-based path's row type, so the trainer,
advantages, staleness checks and metrics need nothing new): prompt ids from the chat template,
the sampled response and its log-probs, the agent's id, the adapter version the engine reported,
``turn`` = the call's index in the episode and ``player`` = the agent's index (each agent is its own
"seat", so returns are discounted over the agent's own calls). When the workflow returns, its
rewards are put on the rows by ``row_rewards`` (the rule is in ``roll_ma.workflows.api``).
"""

from __future__ import annotations

import os
import random
import traceback
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from roll_ma.data.turn_samples import TurnSample
from roll_ma.workflows.api import Reply, WorkflowResult, WorkflowTruncated, as_result


@dataclass
class Failure:
    """Where and why a workflow raised: the deepest frame in the workflow's own file, and the traceback."""

    episode_id: str
    error: str  # "ZeroDivisionError: division by zero"
    location: str  # "/path/flow.py:42 in run"
    traceback: str

    def __str__(self) -> str:
        return f"{self.location}: {self.error}"


@dataclass
class EpisodeRecord:
    """Everything one episode produced."""

    index: int
    episode_id: str
    group_id: str
    seed: int
    task: dict
    samples: list[TurnSample] = field(default_factory=list)
    calls: int = 0
    agent_calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    result: WorkflowResult | None = None
    failure: Failure | None = None
    truncated: bool = False
    tool_stats: dict[str, int] = field(default_factory=dict)


class AgentMap(dict):
    """``agents`` as a workflow sees it: name -> AgentHandle; an unknown name says which agents exist."""

    def __missing__(self, name: str) -> AgentHandle:
        raise KeyError(f"no agent {name!r} in this run; agents: {list(self)} (config: agents)")


class AgentHandle:
    """``agents[name]`` inside a workflow: ``await handle.generate(messages) -> Reply``.

    ``messages`` are chat messages ``[{"role": "system"|"user"|"assistant", "content": str}, ...]``.
    When the agent has a ``system_prompt`` in the config and the messages start without a system
    message, it is put first.
    """

    def __init__(
        self,
        name: str,
        agent_id: int,
        episode: EpisodeRecord,
        submit: Callable[..., Any],
        encode: Callable[[list[dict]], tuple[list[int], bool]],
        system_prompt: str | None,
        max_calls: int,
        env_name: str,
        seed_of: Callable[[str, int], int],
    ):
        self.name, self.agent_id, self.system_prompt = name, agent_id, system_prompt
        self._episode, self._submit, self._encode = episode, submit, encode
        self._max_calls, self._env_name, self._seed_of = max_calls, env_name, seed_of

    def __repr__(self) -> str:
        return f"AgentHandle({self.name!r})"

    async def generate(self, messages: list[dict]) -> Reply:
        ep = self._episode
        messages = _checked_messages(messages, self.name)
        if self.system_prompt and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        if ep.calls >= self._max_calls:
            ep.truncated = True
            raise WorkflowTruncated(f"episode {ep.episode_id} reached env.max_turns={self._max_calls} calls")
        turn, index = ep.calls, ep.agent_calls[self.name]
        ep.calls += 1
        ep.agent_calls[self.name] += 1
        prompt_ids, truncated = self._encode(messages)
        answer = await self._submit(
            ep.index, self.agent_id, turn, prompt_ids, self._seed_of(ep.episode_id, turn)
        )
        ep.samples.append(
            TurnSample(
                prompt_ids=prompt_ids,
                response_ids=answer["response_ids"],
                rollout_log_probs=answer["rollout_log_probs"],
                agent_id=answer["agent_id"],
                adapter_version=answer["adapter_version"],
                episode_id=ep.episode_id,
                group_id=ep.group_id,
                turn=turn,
                player=self.agent_id,
                env_name=self._env_name,
                response_text=answer["response_text"],
                prompt_truncated=truncated,
            )
        )
        return Reply(answer["response_text"], self.name, turn, index, len(answer["response_ids"]), truncated)


def _checked_messages(messages: Any, agent: str) -> list[dict]:
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(
            f"agents[{agent!r}].generate needs a non-empty list of chat messages, got {messages!r}"
        )
    out = []
    for i, m in enumerate(messages):
        if (
            not isinstance(m, Mapping)
            or not isinstance(m.get("role"), str)
            or not isinstance(m.get("content"), str)
        ):
            raise ValueError(
                f"agents[{agent!r}].generate: message {i} must be {{'role': str, 'content': str}}, got {m!r}"
            )
        out.append({"role": m["role"], "content": m["content"]})
    return out


def row_rewards(
    agent_rows: Mapping[str, list[int]], rewards: Mapping[str, Any], agents: list[str]
) -> dict[int, float]:
    """Reward of each row index from a workflow's per-agent rewards (the rule in ``roll_ma.workflows.api``).

    ``agent_rows[a]`` lists agent a's rows in call order. A list reward gives value i to the i-th
    row; a number goes to the agent's last row; unknown agents and wrong list lengths raise ValueError.
    """
    out: dict[int, float] = defaultdict(float)
    for agent, reward in rewards.items():
        if agent not in agents:
            raise ValueError(
                f"the workflow rewarded {agent!r}, which is not an agent of this run; agents: {agents}"
            )
        rows = agent_rows.get(agent, [])
        if isinstance(reward, list):
            if len(reward) != len(rows):
                raise ValueError(
                    f"rewards[{agent!r}] lists {len(reward)} per-call rewards but {agent!r} made {len(rows)} "
                    "calls; give one reward per call, or one number for its whole trajectory"
                )
            for row, value in zip(rows, reward):
                out[row] += value
        elif rows:
            out[rows[-1]] += reward
    return dict(out)


def finish_episode(ep: EpisodeRecord, agents: list[str]) -> None:
    """Order the rows by turn, put the rewards on them and mark the episode's last row done."""
    ep.samples.sort(key=lambda s: s.turn)
    agent_rows: dict[str, list[int]] = defaultdict(list)
    for i, sample in enumerate(ep.samples):
        agent_rows[agents[sample.player]].append(i)
    rewards = ep.result.rewards if ep.result is not None else {}
    for i, value in row_rewards(agent_rows, rewards, agents).items():
        ep.samples[i].reward = float(value)
    if ep.samples:
        ep.samples[-1].done = True


async def play_episode(
    ep: EpisodeRecord,
    make_call: Callable[[], Callable[..., Any]],
    handles: dict[str, AgentHandle],
    extras: dict[str, Any],
    agents: list[str],
    workflow_file: str | None,
    on_failure: Callable[[], None] | None = None,
) -> EpisodeRecord:
    """Build the workflow (``make_call``) and run it once; a raise is recorded in ``ep.failure`` (never
    propagated) and ``on_failure`` called, a truncation is recorded in ``ep.truncated``. ``extras`` holds
    the optional ``run`` arguments the workflow takes (tools, rng)."""
    try:
        value = await make_call()(dict(ep.task), handles, **extras)
    except WorkflowTruncated:  # not caught by the workflow: the episode ends with no rewards
        ep.truncated = True
        finish_episode(ep, agents)
        return ep
    except Exception as err:  # noqa: BLE001 - a user's workflow may raise anything; the policy decides
        ep.failure = describe_failure(err, ep.episode_id, workflow_file)
    else:
        try:
            ep.result = as_result(value)
            finish_episode(ep, agents)
        except (TypeError, ValueError) as err:  # a malformed return value: no frame of the workflow to show
            where = f"{workflow_file or 'the workflow'}: the value run() returned"
            ep.failure = Failure(ep.episode_id, f"{type(err).__name__}: {err}", where, str(err))
    if ep.failure is not None and on_failure is not None:
        on_failure()
    return ep


def episode_rng(seed: int, episode_id: str) -> random.Random:
    return random.Random(f"workflow:{seed}:{episode_id}")


def describe_failure(err: BaseException, episode_id: str, workflow_file: str | None) -> Failure:
    """The error, and the deepest frame of the traceback in the workflow's file (else the deepest frame)."""
    frames = traceback.extract_tb(err.__traceback__)
    target = os.path.realpath(workflow_file) if workflow_file else None
    own = [f for f in frames if target and os.path.realpath(f.filename) == target]
    frame = own[-1] if own else (frames[-1] if frames else None)
    location = f"{frame.filename}:{frame.lineno} in {frame.name}" if frame else "<unknown location>"
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    return Failure(episode_id, f"{type(err).__name__}: {err}", location, text)
