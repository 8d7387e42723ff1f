"""What a driver asks of a worker besides the batch: typed requests, passed next to the ``DataProto``; and
what an update answers (``UpdateResult``: which agents and adapters took a step, and its metrics).

The batch holds the data (its columns, per-batch facts such as ``pad_id``); how to treat it (which
objective, which step, which policies, which reference, how to sample) travels as one of these frozen
dataclasses, so mypy checks it where the call is written and a worker never reads a control flag out of
``meta_info``. The pipeline builds the update and scoring requests (``pipelines/``), the env and workflow
workers the generate requests (``workers/``); the clients carry them (``workers/clients.py``), the train
and inference backends read them (``training/``, ``inference/``).

What stays in ``meta_info`` is about the rows, not about what to do with them:

- ``pad_id``: the pad token of the rows' tokenizer (padding rows of several workers to one width);
- ``episodes``, ``rounds``, ``step``, ``started_at``, ``finished_at``: what an env worker's rollout
  played (one summary per episode, the timeline the benchmarks draw), read by the metrics;
- whatever a caller put there: every backend hands the request's ``meta_info`` back with its answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Objective = Literal["ppo", "sft", "dpo"]  # training/objectives.py: objective_named
PairReference = Literal["copy", "base"]  # DPO's reference: each adapter's frozen copy, or the base


@dataclass(frozen=True)
class GenerateRequest:
    """One generate call's sampling: the rollout config's defaults (``rollout.temperature``, ``top_p``,
    ``max_new_tokens``, ``stop``), each overridden where set here.

    Args:
        greedy: decode the argmax (evaluation; the greedy answers of ``env.show_greedy_moves``); a
            temperature of 0 is greedy too. ``rollout_log_probs`` are then at temperature 1.
        seed: the call's seed: a row's sampling seed is a hash of (seed, the row's ``sample_seed``), so it
            does not depend on which engine gets the row (``inference/rollout_common.row_seeds``); None:
            the engine's own generator.
        temperature, top_p, max_new_tokens, stop: this call's values instead of the config's.
    """

    greedy: bool = False
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None
    stop: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ScoreRequest:
    """A scoring pass (old, reference log-probs): the sampling temperature the rows were drawn at."""

    temperature: float = 1.0


@dataclass(frozen=True)
class DPOSettings:
    """A dpo update's loss settings (a phase's ``dpo.beta``, ``dpo.label_smoothing``, ``dpo.rpo_alpha``)."""

    beta: float
    label_smoothing: float = 0.0
    rpo_alpha: float = 0.0


@dataclass(frozen=True)
class UpdateRequest:
    """One train step: what to optimise, at which step, and which policies take part.

    Args:
        step: the run's step (lr and entropy schedules).
        temperature: the rollout's sampling temperature (the policy loss scores at it).
        objective: ppo (the RL loop), sft or dpo (supervised phases).
        policies: update only these adapters (the streamed sync updates one per call); None: every one.
        agents: the agents (ids) due at ``step``: the run plan's ``due_agents(step)``, so the train workers
            apply no rule of their own; None: every trainable agent.
        critic_only: only the value critic trains (``critic.warmup_steps``); every agent waits.
        behavior_correction: the rows may come from older adapters (``rollout.max_staleness`` > 0): the
            decoupled PPO objective weighs them by pi_old / pi_rollout.
        dpo: the DPO loss's settings; required by ``objective="dpo"``.
    """

    step: int = 0
    temperature: float = 1.0
    objective: Objective = "ppo"
    policies: tuple[str, ...] | None = None
    agents: tuple[int, ...] | None = None
    critic_only: bool = False
    behavior_correction: bool = False
    dpo: DPOSettings | None = None

    def __post_init__(self) -> None:
        if self.objective == "dpo" and self.dpo is None:
            raise ValueError("a dpo update needs its loss settings: UpdateRequest(objective='dpo', "
                             "dpo=DPOSettings(beta=...))")


@dataclass
class UpdateResult:
    """What one update did, typed: the pipeline reads which adapters to push and which rows' FLOPs count
    from here, never from the names of its metrics.

    Attributes:
        metrics: what the console and ``metrics.jsonl`` show: ``agent/<name>/<metric>`` of every agent (its
            ``updated`` 0 or 1 among them, for the user), ``timing/update/<adapter>``, ``train/tokens``, the
            critic's and the worker's own (GPU memory).
        stepped_agents: the agents (ids) whose adapter took an optimizer step.
        updated_adapters: the adapters that took an optimizer step (in update order): only these change,
            so only these are pushed to the rollout engines.
    """

    metrics: dict[str, float] = field(default_factory=dict)
    stepped_agents: tuple[int, ...] = ()
    updated_adapters: tuple[str, ...] = ()
