"""Typed config of supervised runs: the sft and dpo blocks and the chain of phases.

A run either trains by RL (``train.objective: ppo``, the default: ``pipelines/rl/loop.py``)
or runs phases (``pipelines/phases/chain.py``): one phase from ``train.objective: sft | dpo``, or the
chain listed in ``phases`` (e.g. eval, sft, dpo, eval). Each agent always trains its own adapter
on its own rows, with its own optimizer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from roll_ma.config.fields import config_field as _f


@dataclass
class SFTConfig:
    """Supervised fine-tuning per agent: token NLL of each agent's own responses (the prompt never counts)."""

    source: Literal["teacher", "rejection", "file"] = _f(
        "rejection",
        "teacher: the teacher model (teacher.model) writes critiques and refinements of the actor's first "
        "answers; rejection: the run's own episodes with the current adapters, keeping the accepted turns "
        "(an answer that is right, a critique after which the refinement is right); file: sft.path",
    )
    path: str | None = _f(
        None,
        "source=file: a local .jsonl/.parquet/.json in chat-messages form, one example per row: a "
        "'messages' list ending with the assistant's reply (the loss is on that reply) and a column "
        "naming the agent (sft.agent_key); TRL's prompt/completion columns work too",
    )
    messages_key: str = _f("messages", "source=file: the column holding the chat messages")
    agent_key: str = _f("role", "source=file: the column naming the agent each example trains")
    problems: int = _f(256, "source=teacher/rejection: training problems whose episodes make the data", min=1)
    samples_per_problem: int = _f(
        2,
        "rejection: full episodes per problem; teacher: critique-and-refinement branches per first answer",
        min=1,
    )
    accept: Literal["correct", "all"] = _f(
        "correct",
        "source=teacher/rejection: keep only accepted turns (correct) or every turn (all)",
    )
    epochs: int = _f(1, "passes over the SFT rows", min=1)
    batch_size: int = _f(32, "rows per agent per optimizer step", min=1)
    max_steps: int = _f(0, "stop after this many optimizer steps (0: when the epochs are done)", min=0)


@dataclass
class DPOConfig:
    """Direct Preference Optimization per agent on (prompt, chosen, rejected) triplets of its own role."""

    beta: float = _f(0.1, "DPO beta: how far the policy may move from the reference", min=0.0)
    loss_type: Literal["sigmoid"] = _f(
        "sigmoid", "the DPO loss (Rafailov et al. 2023, eq. 7), as TRL's default"
    )
    label_smoothing: float = _f(
        0.0,
        "conservative DPO: the probability that a pair's label is flipped (TRL's label_smoothing)",
        min=0.0,
        max=0.49,
    )
    rpo_alpha: float = _f(
        0.0,
        "weight of the chosen responses' token NLL added to the DPO loss (RPO, Pang et al. 2024; TRL's "
        "rpo_alpha): keeps the chosen answers likely while the margin grows (0: plain DPO)",
        min=0.0,
    )
    reference: Literal["phase_start", "iteration_start", "base"] = _f(
        "phase_start",
        "the reference policy: phase_start = the agent's adapter as it was when the DPO phase started "
        "(a frozen LoRA copy on the same base: no second model is loaded); iteration_start = that copy "
        "refreshed at every iteration of the loop; base = the base model with adapters off",
    )
    source: Literal["built", "file"] = _f(
        "built",
        "built: the iterative loop (generate with the current adapters -> build pairs -> DPO steps -> sync, "
        "dpo.iterations times); file: TRL-format pairs from dpo.path",
    )
    path: str | None = _f(
        None,
        "source=file: a local .jsonl/.parquet/.json with TRL's prompt/chosen/rejected columns (plain "
        "text or chat messages) and a column naming the agent (dpo.agent_key)",
    )
    agent_key: str = _f("role", "source=file: the column naming the agent each pair trains")
    iterations: int = _f(1, "source=built: rounds of generate -> pairs -> DPO -> sync", min=1)
    problems_per_iteration: int = _f(
        64, "source=built: problems played with the current adapters per iteration", min=1
    )
    branches: int = _f(
        4,
        "source=built: continuations sampled from every state (actor: refinements; critic: critiques, each "
        "followed by the actor's refinement); pairs compare branches of one state",
        min=2,
    )
    states_per_episode: int = _f(
        0, "source=built: states of each played episode that are branched (0: every state)", min=0
    )
    pairs_per_state: int = _f(1, "source=built: at most this many pairs from one state", min=1)
    steps_per_iteration: int = _f(4, "source=built: optimizer steps per agent per iteration", min=1)
    epochs: int = _f(1, "source=file: passes over the pairs", min=1)
    batch_size: int = _f(32, "pairs per agent per optimizer step", min=1)


@dataclass
class PhaseConfig:
    """One phase of a chain: train by SFT or DPO, or evaluate."""

    objective: Literal["sft", "dpo", "eval"] = _f("eval", "what the phase does")
    name: str | None = _f(None, "name in logs and checkpoints (default: <index>_<objective>)")
    agents: list[str] | None = _f(
        None, "the agents this phase trains (default: every agent that is not frozen)"
    )
    lr: float | None = _f(
        None,
        "this phase's peak learning rate for every agent it trains (default: train.lr / agents[i].lr)",
        min=0.0,
    )
    sft: dict[str, Any] = _f(
        help="overrides of the sft block for this phase, e.g. {source: file, path: x.jsonl}", factory=dict
    )
    dpo: dict[str, Any] = _f(
        help="overrides of the dpo block for this phase, e.g. {iterations: 2}", factory=dict
    )
