"""Config checks of PPO with a value critic (algorithm.advantage=gae) and of team envs (env.name=marft):
combinations the critic cannot take, and hook files and tasks that do not load, refused before any actor
starts."""

from __future__ import annotations

from roll_ma.config.run_plan import needs_critic, supervised_objective
from roll_ma.config.schema import RunConfig
from roll_ma.config.typed import ConfigProblem

TEAM_ENV = "marft"


def check_team(cfg: RunConfig, problems: list[ConfigProblem]) -> None:
    add = lambda key, msg: problems.append(ConfigProblem(key, msg))  # noqa: E731
    if needs_critic(cfg.algorithm.advantage):
        _check_gae(cfg, add)
    team = cfg.env.name == TEAM_ENV and not cfg.env.workflow
    if not team:
        if cfg.env.path:
            add("env.path", f"a task file is played by the team env: set env.name={TEAM_ENV} (or remove "
                "env.path)")
        if cfg.env.max_assistant_turns is not None:
            add("env.max_assistant_turns", f"counts the turns of the team env: set env.name={TEAM_ENV}")
        for i, agent in enumerate(cfg.agents):
            if agent.process or agent.pre_process_kwargs or agent.post_process_kwargs:
                add(f"agents[{i}].process", f"prompt hooks are run by the team env: set env.name={TEAM_ENV}")
        return
    from roll_ma.envs.team import load_task_class
    from roll_ma.envs.team_hooks import load_hooks

    try:
        load_task_class(cfg.env.path)
    except (ValueError, ImportError, SyntaxError) as err:
        add("env.path", str(err))
    for i, agent in enumerate(cfg.agents):
        try:
            load_hooks(agent)
        except (ValueError, ImportError, SyntaxError) as err:
            add(f"agents[{i}].process", str(err))
    if cfg.env.seats is not None and cfg.env.seats != [a.name for a in cfg.agents]:
        add("env.seats", f"the team env seats the agents in config order; remove env.seats ({cfg.env.seats})")
    n = len(cfg.agents)
    turns = cfg.env.max_assistant_turns
    if turns is not None and n and turns % n:
        add("env.max_assistant_turns", f"{turns} is not a multiple of the team size {n}; each round every "
            f"agent speaks once: use {n * max(1, turns // n)}")


def _check_gae(cfg: RunConfig, add) -> None:
    if cfg.rollout.max_staleness > 0:
        add("rollout.max_staleness", "algorithm.advantage=gae needs the synchronous loop (the critic's "
            "values and update are per step): set rollout.max_staleness=0")
    if cfg.train.full_finetune:
        add("train.full_finetune", "algorithm.advantage=gae puts the critic on the shared base as one more "
            "LoRA adapter; full fine-tuning has no adapters: train LoRA adapters")
    if supervised_objective(cfg.train.objective):
        add("train.objective", f"algorithm.advantage=gae trains a critic for PPO; train.objective="
            f"{cfg.train.objective} has no rewards to value: set algorithm.advantage=grpo")
    if cfg.phases:
        add("phases", "algorithm.advantage=gae is for the RL loop; SFT / DPO phases have no critic: remove "
            "the phases or use algorithm.advantage=grpo")
    if cfg.study.joint_search_every > 0:
        add("study.joint_search_every", "joint search distills into the adapters without the critic; "
            "set it to 0 with algorithm.advantage=gae")
    if cfg.env.workflow:
        add("env.workflow", "algorithm.advantage=gae needs turn rows of episodes (turn-based envs); "
            "workflows use grpo or reinforce_pp")
    names = [a.name for a in cfg.agents]
    seen: set[str] = set()
    for g, group in enumerate(cfg.critic.groups):
        for name in group:
            if name not in names:
                add(f"critic.groups[{g}]", f"{name!r} is not an agent; agents are {names}")
            elif name in seen:
                add(f"critic.groups[{g}]", f"agent {name!r} is in two critic groups; put it in one")
            seen.add(name)
    if cfg.critic.groups and not cfg.critic.share:
        add("critic.groups", "groups share a critic: set critic.share=true, or remove critic.groups")
