"""Many workflow episodes on one asyncio loop, their generate calls batched into one rollout call per tick.

Each episode is an asyncio task. ``AgentHandle.generate`` does not call the engine: it queues a
``Call`` and waits on its future. A **tick** fires when every unfinished episode waits on at least
one generate call and runs no tool; then every queued call goes to the rollout cluster in ONE
synchronous ``generate`` (the batch-oriented call env_worker makes once per round), each future gets
its answer, and the episodes run on to their next calls. So a tick's batch is everything that can be
generated at that moment, whatever order the workflows call their agents in, and the engine sees
batches as large as the turn-based path's.

What delays a tick: a tool call in flight (entered through ``activity``, which the ToolBox does), and
a workflow awaiting anything else (its own sleep or thread): it is waited for. A workflow that never
returns therefore stalls its worker; tools have time limits, so a hanging tool does not.

Deterministic: the calls of a tick are ordered by (episode, turn); the worker seeds each call from
(episode id, turn), so what is sampled does not depend on how calls fall into ticks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Call:
    """One queued generate call: which episode and agent, its prompt, and the future of its answer."""

    episode: int  # index of the episode in the scheduler's batch
    agent_id: int
    turn: int  # index of the call within its episode (all agents)
    prompt_ids: list[int]
    sample_seed: int
    future: asyncio.Future = field(repr=False)


@dataclass
class _EpisodeState:
    pending: int = 0  # queued calls not answered yet
    busy: int = 0  # tool calls (or other registered activities) in flight
    done: bool = False


class TickScheduler:
    """Runs episode coroutines and answers their queued calls in ticks.

    Args:
        generate: ``generate(calls) -> answers`` (one per call, same order); synchronous: while it
            runs every episode is waiting on it anyway.
        on_tick: Called after each tick (progress bars).
    """

    def __init__(
        self, generate: Callable[[list[Call]], Sequence[Any]], on_tick: Callable[[], None] | None = None
    ):
        self._generate = generate
        self._on_tick = on_tick
        self._states: list[_EpisodeState] = []
        self._queue: list[Call] = []
        self._wake: asyncio.Event | None = None
        self._stopped = False
        self.ticks = 0
        self.calls = 0

    # ------------------------------------------------------------------ used by episodes
    def submit(
        self, episode: int, agent_id: int, turn: int, prompt_ids: list[int], sample_seed: int
    ) -> asyncio.Future:
        """Queue a call; the returned future gets the engine's answer at the next tick."""
        future = asyncio.get_running_loop().create_future()
        self._queue.append(Call(episode, agent_id, turn, prompt_ids, sample_seed, future))
        self._states[episode].pending += 1
        self._check()
        return future

    @contextlib.contextmanager
    def activity(self, episode: int) -> Iterator[None]:
        """Mark the episode busy (a tool runs): no tick fires until it ends."""
        state = self._states[episode]
        state.busy += 1
        try:
            yield
        finally:
            state.busy -= 1
            self._check()

    def stop(self) -> None:
        """End the run now: unfinished episodes are cancelled (a workflow error, on_workflow_error=raise)."""
        self._stopped = True
        if self._wake is not None:
            self._wake.set()

    # ------------------------------------------------------------------ the loop
    async def run(self, coroutines: Sequence[Coroutine]) -> list[Any]:
        """Run every coroutine to its end; returns their results (or exceptions) in order."""
        self._wake = asyncio.Event()
        self._states = [_EpisodeState() for _ in coroutines]
        tasks = [asyncio.ensure_future(self._episode(i, c)) for i, c in enumerate(coroutines)]
        try:
            while True:
                self._check()
                await self._wake.wait()
                self._wake.clear()
                if self._stopped or all(s.done for s in self._states):
                    break
                self._tick()
        finally:
            for task in tasks:
                if not task.done():
                    task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
        return list(results)

    async def _episode(self, index: int, coroutine: Coroutine) -> Any:
        try:
            return await coroutine
        finally:
            self._states[index].done = True
            self._check()

    def _tick(self) -> None:
        calls = sorted(self._queue, key=lambda c: (c.episode, c.turn))
        self._queue = []
        for call in calls:
            self._states[call.episode].pending -= 1
        live = [c for c in calls if not c.future.done()]  # a workflow may have cancelled a call
        if live:
            answers = self._generate(live)
            if len(answers) != len(live):
                raise RuntimeError(f"the rollout answered {len(answers)} of {len(live)} calls")
            self.ticks += 1
            self.calls += len(live)
            for call, answer in zip(live, answers):
                if not call.future.done():
                    call.future.set_result(answer)
        if self._on_tick is not None:
            self._on_tick()

    def _check(self) -> None:
        """Wake the loop when every unfinished episode waits on a call and nothing else (or all are done)."""
        if self._wake is None:
            return
        if self._stopped or all(s.done or (s.pending > 0 and s.busy == 0) for s in self._states):
            self._wake.set()


def run_coroutine(coroutine: Coroutine) -> Any:
    """Run a coroutine to completion from synchronous code, also where this thread already runs a loop."""
    try:
        asyncio.get_running_loop()
        running = True
    except RuntimeError:
        running = False
    if not running:  # why outside the except: errors of the run must not read as raised "during handling"
        return asyncio.run(coroutine)
    # why a thread: a notebook (or an async actor) already runs a loop in this thread
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
