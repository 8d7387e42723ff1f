"""What a run does, worked out once from its config: the RL loop (and which step) or supervised phases,
a value critic or not, reference log-probs or not, whether a group's prompt runs once, every agent with
its train cycle and LoRA settings, and which agents an update trains at each step. This module is the
one place that reads ``algorithm.advantage`` or ``train.objective`` strings for what kind of run they make
(the registries read them for which function to call).

Worked out once per run, by ``pipelines.run_training``, which hands the one plan down: to the session
(``RunSession.plan``), the workers' settings, the steps' update requests (``UpdateRequest.agents``: the
agents due, so the train workers apply no rule of their own). The checks that run before it (config
loading, pre-flight) and a process holding only a block of the config read the rule for what they need
(``rl_loop``, ``needs_critic``, ``prompt_sharing``): the same functions the plan is made of. It never
raises: the checks read those rules while they validate the config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from roll_ma.config.schema import LoraConfig, RunConfig, TrainConfig

RL_OBJECTIVE = "ppo"  # train.objective of the RL loop; sft / dpo make the run one supervised phase
# algorithm.advantage whose estimator reads a value critic's values (GAE); the others need returns only
CRITIC_ESTIMATOR = "gae"
# model.attn_implementation that runs packed rows with a group's prompt once (models/varlen_attention.py)
VARLEN_ATTENTION = "roll_ma_varlen"

# the RL loop's step (pipelines/rl/loop.py: choose_step); "phases": no RL step, the supervised phases run
StepKind = Literal["synchronous", "streamed", "joint_search", "phases"]


def needs_critic(advantage: str) -> bool:
    """The estimator ``algorithm.advantage`` names reads a value critic: the train workers hold one."""
    return advantage == CRITIC_ESTIMATOR


def supervised_objective(objective: str) -> bool:
    """``train.objective`` names a supervised phase (sft, dpo), not the RL loop."""
    return objective != RL_OBJECTIVE


def prompt_sharing(train: TrainConfig, attention: str | None) -> bool:
    """Whether a group's prompt runs once (``train.share_prompt_prefix``) in packed rows (``train.
    remove_padding``) under ``attention`` (``model.attn_implementation``; None: the default, roll_ma_varlen).
    true as given (the config check refused it where it cannot run); false; auto: on under the default
    attention, else off (``prompt_sharing_note`` says why)."""
    setting = train.share_prompt_prefix
    if setting is False or not train.remove_padding:
        return False
    return setting is True or attention in (None, VARLEN_ATTENTION)


def prompt_sharing_note(train: TrainConfig, attention: str | None) -> str | None:
    """The line a run prints where ``share_prompt_prefix=auto`` turns itself off (None: nothing to say;
    padded rows have no shared prompt to run once)."""
    if train.share_prompt_prefix != "auto" or not train.remove_padding or prompt_sharing(train, attention):
        return None
    return (f"[roll_ma] train.share_prompt_prefix=auto: off, model.attn_implementation={attention} (a "
            f"group's prompt runs once under the default attention, {VARLEN_ATTENTION}); every row runs "
            "its own")


@dataclass(frozen=True)
class PlannedAgent:
    """One agent as the run trains it.

    Attributes:
        agent_id: its index in ``agents`` (the rows' ``agent_id`` column).
        name: ``agents[i].name``.
        adapter: the adapter it trains and is served with (agents may share one).
        frozen: never updated.
        update_every: its adapter takes a step every k-th run step: its own ``update_every``, or
            ``train.train_cycle`` where it sets none (1).
        lora: its LoRA settings, its overrides on top of the ``lora`` block.
    """

    agent_id: int
    name: str
    adapter: str
    frozen: bool
    update_every: int
    lora: LoraConfig


def planned_agents(cfg: RunConfig) -> tuple[PlannedAgent, ...]:
    """``cfg.agents`` with their train cycle and LoRA settings resolved."""
    return tuple(
        PlannedAgent(i, a.name, a.adapter_name, a.frozen,
                     a.update_every if a.update_every != 1 else cfg.train.train_cycle, cfg.agent_lora(a))
        for i, a in enumerate(cfg.agents)
    )


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
        step_kind: the RL loop's step: streamed one step ahead (``rollout.max_staleness`` > 0), synchronous
            with a joint search (``study.joint_search_every`` > 0) or synchronous; "phases" without RL.
        shares_prompts: a group's prompt runs once in the scoring and update passes (``prompt_sharing``).
        loss_terms: the study's extra terms of the PPO loss, by the name ``roll_ma.studies`` registers them
            under: "action_entropy" (``study.action_entropy_coef`` > 0).
        advantage_weights: the study's weights of the rows' advantages, by registered name:
            "balance_reward_classes" (``study.balance_reward_classes``), or None.
        agents: every agent (index = ``agent_id``) with its train cycle and LoRA settings.
    """

    rl: bool
    objectives: tuple[str, ...]
    uses_critic: bool
    critic_warmup_steps: int
    reference_needed: bool
    reference_workers: int
    step_kind: StepKind
    shares_prompts: bool
    agents: tuple[PlannedAgent, ...]
    loss_terms: tuple[str, ...]
    advantage_weights: str | None

    def critic_only(self, step: int) -> bool:
        """Step ``step`` trains the critic alone (its warm-up): the agents' adapters wait."""
        return self.uses_critic and step <= self.critic_warmup_steps

    def due_agents(self, step: int) -> tuple[int, ...]:
        """The agents (ids) whose adapters the update of ``step`` trains: not frozen, their train cycle
        divides the step, and the critic is not warming up. The one rule: the driver reads it for what it
        pushes and scores, and sends it to the train workers in the update request."""
        if self.rl and self.critic_only(step):  # a phase's update never waits for a critic
            return ()
        return tuple(a.agent_id for a in self.agents if not a.frozen and step % a.update_every == 0)

    def idle_agents(self, step: int) -> list[int]:
        """The agents (ids) the update of ``step`` leaves alone (the complement of ``due_agents``)."""
        due = set(self.due_agents(step))
        return [a.agent_id for a in self.agents if a.agent_id not in due]

    def worker_train_config(self, train: TrainConfig) -> TrainConfig:
        """``train`` as the workers run it: ``share_prompt_prefix`` resolved to this plan's true or false
        (a train worker refuses auto: it would have to decide it again, by another rule)."""
        return dataclasses.replace(train, share_prompt_prefix=self.shares_prompts)


def rl_loop(cfg: RunConfig) -> bool:
    """The RL loop runs (``train.objective=ppo`` and no ``phases``); False: the supervised phases. The rule
    the config checks read (they run before there is a plan)."""
    return not cfg.phases and not supervised_objective(cfg.train.objective)


def run_plan(cfg: RunConfig) -> RunPlan:
    """The plan of ``cfg`` (validated or being validated: it reads keys, it checks none)."""
    rl = rl_loop(cfg)
    objectives: tuple[str, ...] = tuple(p.objective for p in cfg.phases) or (cfg.train.objective,)
    uses_critic = needs_critic(cfg.algorithm.advantage)
    reference_needed = cfg.algorithm.kl_coef > 0
    step_kind: StepKind = "phases"
    if rl:
        step_kind = ("streamed" if cfg.rollout.max_staleness > 0 else
                     "joint_search" if cfg.study.joint_search_every > 0 else "synchronous")
    return RunPlan(
        rl=rl,
        objectives=objectives,
        uses_critic=uses_critic,
        critic_warmup_steps=cfg.critic.warmup_steps if uses_critic else 0,
        reference_needed=reference_needed,
        reference_workers=cfg.reference.num_workers if cfg.reference.mode == "worker" and reference_needed
        else 0,
        step_kind=step_kind,
        shares_prompts=prompt_sharing(cfg.train, cfg.model.attn_implementation),
        agents=planned_agents(cfg),
        loss_terms=("action_entropy",) if cfg.study.action_entropy_coef > 0 else (),
        advantage_weights="balance_reward_classes" if cfg.study.balance_reward_classes else None,
    )
