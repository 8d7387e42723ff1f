"""The train rollouts of a run: played when a step needs them, or one step ahead of the trainer.

``ahead=False`` (``rollout.max_staleness=0``): ``take(step)`` plays the step's episodes and waits.
``ahead=True``: after taking step s, the pipeline ``launch``es step s + 1 at once; the env workers
play it against the rollout engines while the trainer works on step s, and ``take(s + 1)`` then waits
only for what is left. One rollout is in flight at a time (the env workers play one step at a time),
so a row is at most one adapter version behind when it is trained on.

What a checkpoint holds: the episode planner's state from BEFORE the launched rollout's episodes
were drawn (``planner_state``), so a run killed with a rollout in flight regenerates that rollout's
episodes after a resume (the same problems and seeds, played by the checkpoint's adapters); rows
generated but not yet trained are never stored.
"""

from __future__ import annotations

import copy
from typing import Any

from roll_ma.pipelines.clusters import RunWorkers
from roll_ma.protocol import DataProto
from roll_ma.workers.clients import Call


class RolloutQueue:
    """Train rollouts of the env workers (``workers.env``) against the rollout workers.

    Args:
        workers: the run's ``RunWorkers``.
        planner: the ``EpisodePlanner`` (draws each step's episodes; its state is checkpointed).
        ahead: launch the next step's rollout while the trainer works on this one.
    """

    def __init__(self, workers: RunWorkers, planner: Any, ahead: bool):
        self.workers, self.planner, self.ahead = workers, planner, ahead
        self._step: int | None = None  # the step of the rollout in flight (or finished, not taken)
        self._pending: Call[list[DataProto]] | None = None  # its call in flight
        self._done: list[DataProto] | None = None  # its result, once waited for
        self._state_before: dict | None = None  # the planner's state before its episodes were drawn

    def _dispatch(self, step: int) -> Call[list[DataProto]]:
        assignments = self.planner.train_assignments(step, self.workers.env.world_size)
        return self.workers.env.async_run_episodes(self.workers.rollout, assignments, step)

    def launch(self, step: int) -> None:
        """Start step ``step``'s rollout now (ahead only); it runs while the caller goes on."""
        if not self.ahead or self._step is not None:
            return
        self._state_before = copy.deepcopy(self.planner.state_dict())
        self._step, self._pending, self._done = step, self._dispatch(step), None

    def settle(self) -> None:
        """Wait for the rollout in flight, keeping its result (before an evaluation uses the env workers)."""
        if self._pending is not None:
            self._done, self._pending = self._pending.get(), None

    def take(self, step: int) -> list[DataProto]:
        """Every env worker's rows of step ``step``: the launched rollout's, or played now."""
        if self._step is None:
            return self._dispatch(step).get()
        if self._step != step:
            raise RuntimeError(f"the rollout in flight is step {self._step}'s, step {step}'s was asked for")
        self.settle()
        parts, self._step, self._done, self._state_before = self._done, None, None, None
        assert parts is not None  # settle() waited for the rollout in flight
        return parts

    def planner_state(self) -> dict:
        """What a checkpoint stores: the planner's state before any rollout that has not been trained on."""
        if self._step is None:
            return self.planner.state_dict()
        assert self._state_before is not None  # launch() saved it
        return self._state_before
