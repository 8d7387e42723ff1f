"""Training data of the reflection game, made from played episodes (pure functions, no workers).

- **States and branches.** Every turn boundary of a played episode is a state: the problem and the
  texts played so far. ``branch_specs`` asks for ``branches`` continuations of each state, played by
  the env workers like any episode (``MathReflectionEnv.reset`` takes ``history`` and ``horizon``):
  an actor state plays one turn (a refinement, or the first answer), a critic state two (a critique
  and the actor's refinement after it). All branches of a state share the first mover's context
  token for token, and the episode's ``branch_success`` says whether the first answer given in it
  is right.
- **DPO pairs** (``build_pairs``), per state: a continuation whose outcome is right (chosen) against
  one whose outcome is wrong (rejected), from the same context. For the actor: a refinement that
  reaches the ground truth against one that does not; for the critic: feedback after which the
  refinement became right against feedback after which it did not. A response that occurs with
  both outcomes (the critic's feedback, followed by a right and a wrong refinement) is ambiguous
  and never used; identical responses count once.
- **Accepted turns** (``accepted_rows``): the rows an agent should imitate in SFT (rejection
  sampling, or a teacher's data): an answer that is right, a critique after which the refinement
  is right; the env gives exactly these turns a reward of 1.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from roll_ma.inference.rollout_common import scoring_rows
from roll_ma.protocol import DataProto
from roll_ma.workers.env_worker import EpisodeSpec


@dataclass(frozen=True)
class Branch:
    """The first move of one branch episode: who moved, what it saw and said, and how the branch ended."""

    state: str  # the state the branch started from (its group_id)
    agent_id: int
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    success: bool


@dataclass(frozen=True)
class Pair:
    """A DPO triplet of one agent: the same prompt, a chosen and a rejected response."""

    state: str
    agent_id: int
    prompt_ids: tuple[int, ...]
    chosen_ids: tuple[int, ...]
    rejected_ids: tuple[int, ...]


def episode_texts(batch: DataProto) -> dict[str, list[str]]:
    """episode_id -> the texts of its model turns in turn order."""
    turns: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for eid, turn, text in zip(
        batch.non_tensor.get("episode_id", []),
        batch.non_tensor.get("turn", []),
        batch.non_tensor.get("response_text", []),
        strict=True,
    ):
        turns[str(eid)].append((int(turn), str(text)))
    return {eid: [t for _, t in sorted(ts)] for eid, ts in turns.items()}


def branch_specs(
    played: list[EpisodeSpec],
    texts: dict[str, list[str]],
    branches: int,
    states_per_episode: int,
    seed: int,
    tag: str,
) -> list[EpisodeSpec]:
    """``branches`` episodes from every state of the played episodes (at most ``states_per_episode`` per
    episode, drawn at random; 0: all). Identical states (the same problem, the same texts so far) are
    branched once; the first answer's state is the problem alone, shared by a problem's episodes."""
    rng = random.Random(f"{seed}/{tag}")
    seen: set[tuple[str, tuple[str, ...]]] = set()
    specs: list[EpisodeSpec] = []
    for spec in played:
        if spec.problem is None:
            raise ValueError("branching needs episodes played on given problems")
        history = texts.get(spec.episode_id, [])
        points = list(range(len(history)))
        if 0 < states_per_episode < len(points):
            points = sorted(rng.sample(points, states_per_episode))
        for t in points:
            key = (str(spec.problem["problem"]), tuple(history[:t]))
            if key in seen:
                continue
            seen.add(key)
            state = f"{tag}-s{len(seen) - 1}"
            problem = {**spec.problem, "history": history[:t], "horizon": 1 if t % 2 == 0 else 2}
            specs += [EpisodeSpec(f"{state}-b{k}", state, spec.seed, problem) for k in range(branches)]
    return specs


def branches_from_rollout(batch: DataProto, episodes: list[dict]) -> list[Branch]:
    """The first move of every branch episode (its row with turn 0) and the branch's outcome."""
    success = {e["episode_id"]: e["metrics"].get("branch_success") for e in episodes}
    if len(batch) == 0:
        return []
    prompts, responses = scoring_rows(batch)
    out = []
    for i in range(len(batch)):
        eid = str(batch.non_tensor["episode_id"][i])
        if int(batch.non_tensor["turn"][i]) != 0 or success.get(eid) is None:
            continue
        out.append(
            Branch(
                str(batch.non_tensor["group_id"][i]),
                int(batch.non_tensor["agent_id"][i]),
                tuple(prompts[i]),
                tuple(responses[i]),
                bool(success[eid]),
            )
        )
    return out


def build_pairs(branches: list[Branch], pairs_per_state: int = 1) -> list[Pair]:
    """Up to ``pairs_per_state`` (chosen = a successful response, rejected = a failed one) pairs per state,
    from the same prompt, in the order the branches came (module docstring)."""
    by_state: dict[str, list[Branch]] = defaultdict(list)
    for b in branches:
        by_state[b.state].append(b)
    pairs = []
    for state, group in by_state.items():
        if len({(b.agent_id, b.prompt_ids) for b in group}) != 1:
            raise ValueError(f"state {state!r}: its branches' first moves do not share one agent and prompt")
        outcomes: dict[tuple[int, ...], set[bool]] = defaultdict(set)
        for b in group:
            outcomes[b.response_ids].add(b.success)
        good = [r for r, o in outcomes.items() if o == {True}]
        bad = [r for r, o in outcomes.items() if o == {False}]
        first = group[0]
        for chosen, rejected in list(zip(good, bad))[:pairs_per_state]:
            pairs.append(Pair(state, first.agent_id, first.prompt_ids, chosen, rejected))
    return pairs


def accepted_rows(batch: DataProto) -> np.ndarray:
    """Positions of the accepted turns (reward 1: a right answer, a critique followed by a right one)."""
    if len(batch) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.nonzero(batch.batch["scores"].numpy() >= 1.0)[0]
