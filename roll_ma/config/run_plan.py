"""What a run does, worked out once from its config: the RL loop or supervised phases, a value critic or
not, reference log-probs or not. The pipelines, stages and checks read the plan instead of testing
``algorithm.advantage`` or ``train.objective`` strings again; this module is the one place that reads
those strings for what kind of run they make (the registries read them for which function to call).

A pure function of the config, so any process holding the config (a worker, a check) derives the same
plan; one holding only a block of it uses the rule for that block (``needs_critic``). It never raises:
the checks read it while they validate the config.
"""

from __future__ import annotations

from dataclasses import dataclass

from roll_ma.config.schema import RunConfig

RL_OBJECTIVE = "ppo"  # train.objective of the RL loop; sft / dpo make the run one supervised phase
# algorithm.advantage whose estimator reads a value critic's values (GAE); the others need returns only
CRITIC_ESTIMATOR = "gae"


def needs_critic(advantage: str) -> bool:
    """The estimator ``algorithm.advantage`` names reads a value critic: the train workers hold one."""
    return advantage == CRITIC_ESTIMATOR


def supervised_objective(objective: str) -> bool:
    """``train.objective`` names a supervised phase (sft, dpo), not the RL loop."""
    return objective != RL_OBJECTIVE


@dataclass(frozen=True)
class RunPlan:
    """What one run does, as its config says.

    Attributes:
        rl: the RL loop runs (``train.objective=ppo`` and no ``phases``); False: the supervised phases.
        objectives: what each train step optimises: ``("ppo",)`` for the RL loop, else each phase's
            objective in order (``phases``, or the one of ``train.objective``).
        uses_critic: the train workers hold a value critic (``algorithm.advantage=gae``); each RL step
            scores its values, which the advantages read, and trains it.
        critic_warmup_steps: steps 1..n train the critic only (``critic.warmup_steps``; 0 without one).
        reference_needed: a loss or the reward reads reference log-probs (the KL term, kl_coef > 0).
        reference_workers: reference actors to start (``reference.mode=worker`` and reference_needed).
    """

    rl: bool
    objectives: tuple[str, ...]
    uses_critic: bool
    critic_warmup_steps: int
    reference_needed: bool
    reference_workers: int

    def critic_only(self, step: int) -> bool:
        """Step ``step`` trains the critic alone (its warm-up): the agents' adapters wait."""
        return self.uses_critic and step <= self.critic_warmup_steps


def run_plan(cfg: RunConfig) -> RunPlan:
    """The plan of ``cfg`` (validated or being validated: it reads keys, it checks none)."""
    rl = not cfg.phases and not supervised_objective(cfg.train.objective)
    objectives: tuple[str, ...] = tuple(p.objective for p in cfg.phases) or (cfg.train.objective,)
    uses_critic = needs_critic(cfg.algorithm.advantage)
    reference_needed = cfg.algorithm.kl_coef > 0
    return RunPlan(
        rl=rl,
        objectives=objectives,
        uses_critic=uses_critic,
        critic_warmup_steps=cfg.critic.warmup_steps if uses_critic else 0,
        reference_needed=reference_needed,
        reference_workers=cfg.reference.num_workers if cfg.reference.mode == "worker" and reference_needed
        else 0,
    )
