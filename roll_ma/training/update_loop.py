"""The one update loop of every objective: PPO's policy loss, SFT, DPO and the critic's value loss.

    for each epoch:
        for each mini-batch of rows (shuffled the same way on every rank when it is a real subset):
            for each of this rank's micro-batches (MicroBatching.rank_plan; every rank runs as many):
                loss = objective.micro_loss(rows, ...)     # divided by the mini-batch's GLOBAL count
                backward(loss)
            one optimizer step
    per-agent sums, all-reduced over the ranks

An objective is a peer of the others behind ``MicroBatchLoss``: it says what each row adds to the loss's
denominators and gives the loss of a micro-batch, adding its per-agent quantities to named sums. The
engine (``PolicyEngine``) only steps. The data-parallel rule: DeepSpeed averages the ranks' gradients,
so each rank divides its micro-batch's loss by (the mini-batch's global count / world size).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from roll_ma.config.schema import AlgorithmConfig, StudyConfig
from roll_ma.distributed.progress import progress_bar
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import DPOSettings
from roll_ma.training.agent_sums import AgentSums
from roll_ma.training.policy_engine import PolicyEngine


class MicroBatchLoss(Protocol):
    """What the update loop minimises: PPO's policy loss, SFT, DPO or the critic's value loss.

    ``counts`` is (N, C): what each row adds to each of the loss's C denominators (its response tokens,
    1 per pair, ...). A mini-batch whose column 0 sums to 0 has nothing to learn and is skipped.
    ``sum_fields`` names the per-agent quantities the loss adds up (``AgentSums`` columns).
    """

    counts: np.ndarray
    sum_fields: tuple[str, ...]

    def micro_loss(
        self, idx: torch.Tensor, real: torch.Tensor, local_denoms: np.ndarray, sums: AgentSums
    ) -> torch.Tensor:
        """The loss of rows ``idx`` ((b,) int64), divided by ``local_denoms`` ((C,): each denominator's
        mini-batch sum / world size); adds this micro-batch's per-agent quantities to ``sums``.
        ``real`` ((b,) float32) is 0 on the placeholder row an empty micro-batch runs (this rank has
        fewer micro-batches than another and must run as many backwards): it must weigh nothing."""
        ...


@dataclass
class UpdatePlan:
    """How the loop walks the rows of one update.

    Args:
        rows: (n,) the row indices to train on, in order (PPO: all; a critic: its agents' rows).
        prompt_lens, response_lens: (N,) real tokens of every row (what the micro-batch planner counts).
        slots: agent slots of the per-agent sums (1 for a critic).
        epochs: passes over the rows.
        shuffle: shuffle mini-batches that are a real subset (same permutation on every rank); SFT and DPO
            do not (their driver shuffles the data).
        progress: label of a progress bar (rank 0 draws it; every rank reports a sign of life), or None.
        keep_train_mode: set train mode only when the module is not in it already (skips a walk over
            every module; right where nothing leaves a submodule in eval under a training root: the
            policies, whose scoring puts the whole model in eval).
        groups: (N,) prompt group of every row when groups share their prompt (the planner keeps a
            group together and counts its prompt once), else None.
    """

    rows: np.ndarray
    prompt_lens: np.ndarray
    response_lens: np.ndarray
    slots: int
    epochs: int = 1
    shuffle: bool = False
    progress: str | None = None
    keep_train_mode: bool = False
    groups: np.ndarray | None = None


@dataclass
class PolicyUpdate:
    """What one policy's update did: per-agent metrics (agent id -> name -> value) and optimizer facts."""

    agent_metrics: dict[int, dict[str, float]] = field(default_factory=dict)
    optimizer_steps: int = 0
    grad_norm: float = 0.0  # mean over the mini-batches
    lr: float = 0.0
    skipped_nonfinite: int = 0  # optimizer steps skipped because the gradient overflowed
    last_grad_norm: float = 0.0


def run_update(
    engine: PolicyEngine, objective: MicroBatchLoss, plan: UpdatePlan, step: int
) -> tuple[PolicyUpdate, AgentSums]:
    """Epochs x mini-batches x this rank's micro-batches; one optimizer step per mini-batch.

    Returns the optimizer facts and the per-agent sums of ``objective.sum_fields``, all-reduced over the
    ranks (every rank returns the same).
    """
    n = len(plan.rows)
    mini = min(engine.train_cfg.mini_batch_size or n, n)
    counts = objective.counts.reshape(len(objective.counts), -1)  # (N, C)
    sums = AgentSums(objective.sum_fields, plan.slots)
    norms: list[float] = []
    nonfinite = 0
    lr = engine.current_lr
    engine.start_update(plan.keep_train_mode)
    bar = (
        progress_bar(plan.progress, plan.epochs * math.ceil(n / mini), "batch", draw=engine.rank == 0)
        if plan.progress is not None
        else None
    )
    for epoch in range(plan.epochs):
        order = plan.rows
        if plan.shuffle and mini < n:
            order = plan.rows[np.random.default_rng([engine.seed, step, epoch, engine.index]).permutation(n)]
        for start in range(0, n, mini):
            batch_idx = order[start : start + mini]
            if bar is not None:
                bar.update()
            denoms = counts[batch_idx].sum(0)  # (C,)
            if denoms[0] == 0:
                continue  # no signal; an Adam step on zero gradients would still move by momentum
            local_denoms = denoms / engine.world_size
            micro = engine.batching.rank_plan(
                batch_idx, plan.prompt_lens, plan.response_lens, engine.rank, engine.world_size, plan.groups
            )
            for j, rows_j in enumerate(micro):
                idx = rows_j if len(rows_j) else batch_idx[:1]  # an empty micro-batch: a placeholder row
                real = np.full(len(idx), 1.0 if len(rows_j) else 0.0, dtype=np.float32)  # (b,)
                engine.begin_micro_batch(last=j == len(micro) - 1)
                loss = objective.micro_loss(torch.from_numpy(idx), torch.from_numpy(real), local_denoms, sums)
                engine.backward(loss)
            lr = engine.current_lr  # the lr this step uses (the scheduler advances inside step())
            norm, stepped = engine.optimizer_step()
            nonfinite += int(not stepped)
            norms.append(norm)
    if bar is not None:
        bar.close()
    result = PolicyUpdate(
        optimizer_steps=len(norms) - nonfinite,
        grad_norm=float(np.mean(norms)) if norms else 0.0,
        lr=lr,
        skipped_nonfinite=nonfinite,
        last_grad_norm=norms[-1] if norms else 0.0,
    )
    return result, sums.reduced(engine.device)


@dataclass
class UpdateContext:
    """What a train step tells an objective besides its rows."""

    step: int
    temperature: float
    algo_cfg: AlgorithmConfig
    study_cfg: StudyConfig
    behavior_correction: bool = False  # UpdateRequest.behavior_correction: the decoupled PPO objective
    dpo: DPOSettings | None = None  # UpdateRequest.dpo: the DPO loss's settings
    loss_terms: tuple[LossTermMaker, ...] = ()  # a study's extra terms of the PPO loss (``LossTerm``)


@dataclass
class TermPart:
    """What a ``LossTerm`` adds to one micro-batch: its loss and each row's share of its per-agent sums."""

    loss: torch.Tensor  # () added to the micro-batch's loss
    row_sums: dict[str, torch.Tensor]  # each of the term's sum_fields -> (b,) detached, 0 on padding rows


class LossTerm(Protocol):
    """An extra term of the PPO loss that a study adds (``roll_ma/studies``: the action entropy bonus).

    A ``LossTermMaker`` builds it per policy update from the rows (or returns None: off at this step). It has
    a denominator of its own (``counts``; the update loop sums it per mini-batch like the loss's) and
    per-agent sums of its own (``sum_fields``), from which it reports its metrics.
    """

    counts: np.ndarray  # (N,) what each row adds to the term's denominator
    sum_fields: tuple[str, ...]  # the per-agent quantities it adds up (beside the objective's own)

    def micro_loss(self, idx: torch.Tensor, real: torch.Tensor, local_denom: float) -> TermPart | None:
        """The term over rows ``idx`` ((b,); ``real``: 0 on a placeholder row) divided by ``local_denom`` (its
        mini-batch count / world size, > 0: a mini-batch that counts nothing for the term skips it), or
        None (no loss, zero sums). Runs after the objective's own forward of the micro-batch."""
        ...

    def agent_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """One agent's metrics from its all-reduced ``sum_fields``."""
        ...


# builds a policy update's term from its engine, its rows and the step (None: off); the train worker gets
# the makers with its spec (``TrainWorkerSpec.loss_terms``): Ray ships a study's function by reference
LossTermMaker = Callable[[PolicyEngine, DataProto, UpdateContext], LossTerm | None]


class TrainObjective(Protocol):
    """One way to update a policy from its agents' rows, chosen by ``UpdateRequest.objective``
    (``objectives.objective_named``): builds its ``MicroBatchLoss`` and runs ``run_update``."""

    name: str
    trains_critic: bool  # its rows carry the returns and values a value critic (GAE) learns from

    def check(self, data: DataProto, algo_cfg: AlgorithmConfig) -> None:
        """Raise ValueError naming what the batch lacks."""
        ...

    def row_tokens(self, data: DataProto) -> np.ndarray:
        """(B,) tokens each row trains on (for the per-agent ``tokens`` metric)."""
        ...

    def update(
        self,
        engine: PolicyEngine,
        rows: DataProto,
        agent_of_row: np.ndarray,
        agent_ids: list[int],
        ctx: UpdateContext,
    ) -> PolicyUpdate:
        """Update ``engine``'s policy from ``rows`` (every row belongs to one of ``agent_ids``)."""
        ...
