"""Checks of the asynchronous pipeline (``rollout.max_staleness > 0``), run with the others before any actor
starts: what it needs, and the settings it cannot run with."""

from __future__ import annotations

from roll_ma.config.run_plan import rl_loop
from roll_ma.config.schema import RunConfig
from roll_ma.config.typed import ConfigProblem
from roll_ma.preflight.validate_backends import rollout_traits_or_none

KEY = "rollout.max_staleness"


def colocated_with_sleep(cfg: RunConfig) -> bool:
    """The engine shares a GPU with the trainer and sleeps while it trains: nothing can overlap."""
    res = cfg.resources
    if res.num_gpus == 0 or cfg.rollout.sleep_level == 0:
        return False
    traits = rollout_traits_or_none(cfg.rollout.backend)
    if traits is None or not traits.sleep_frees_gpu:
        return False
    every = list(range(res.num_gpus))
    rollout = set(res.device_mapping.get("rollout", every))
    train = set(res.device_mapping.get("train", every))
    return bool(rollout & train)


def check_async(cfg: RunConfig, problems: list[ConfigProblem]) -> None:
    if cfg.rollout.max_staleness == 0:
        return
    add = lambda msg: problems.append(ConfigProblem(KEY, msg))  # noqa: E731
    if colocated_with_sleep(cfg):
        add("the rollout engine shares its GPU with the trainer and sleeps while it trains, so the next "
            "rollout cannot overlap the update (max_staleness stays 0 there): set rollout.sleep_level=0 "
            "when both fit in memory (a 7B engine and a 7B trainer do on 80 GB), or give the rollout its own "
            "GPU (resources.device_mapping)")
    if not cfg.rollout.log_probs:
        add("rows from older adapters are weighted by pi_old / pi_rollout, which needs the engine's "
            "log-probs: set rollout.log_probs=true")
    if cfg.study.joint_search_every > 0:
        add("the joint policy search distills into every adapter between two steps, which an overlapping "
            "rollout would not see: use max_staleness=0 with study.joint_search_every")
    if not rl_loop(cfg):
        add("supervised phases (train.objective sft / dpo, phases) have no rollout to overlap: "
            "max_staleness applies to the RL loop (train.objective=ppo) only")
