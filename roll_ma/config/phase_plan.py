"""The phases a run trains through, as they run: ``cfg.phases`` (or the one phase of ``train.objective``)
with each phase's overrides applied. A rule of the config alone, shared by its checks and the pipelines."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from roll_ma.config.run_plan import supervised_objective
from roll_ma.config.schema import DPOConfig, PhaseConfig, RunConfig, SFTConfig


@dataclass
class Phase:
    """One phase as it runs: position, name, objective, the agents it trains, its sft / dpo settings."""

    index: int
    name: str
    objective: str
    agents: list[str]
    sft: SFTConfig
    dpo: DPOConfig
    lr: float | None = None

    @property
    def label(self) -> str:
        """The name in console lines, after its objective unless the name already says it ('dpo', '1_sft',
        'sft warmup'): a phase named as its objective would read 'dpo dpo'."""
        return self.name if self.objective in self.name else f"{self.objective} {self.name}"


def listed_phases(cfg: RunConfig) -> list[PhaseConfig]:
    """``cfg.phases``, or the one phase ``train.objective`` names; empty for an RL run (objective ppo)."""
    if cfg.phases:
        return list(cfg.phases)
    if not supervised_objective(cfg.train.objective):
        return []
    return [PhaseConfig(objective="sft" if cfg.train.objective == "sft" else "dpo")]


def plan_phases(cfg: RunConfig) -> list[Phase]:
    """``cfg.phases``, or the one phase of ``train.objective``; overrides applied (validated before)."""
    listed = listed_phases(cfg)
    trainable = [a.name for a in cfg.agents if not a.frozen]
    return [
        Phase(
            i,
            p.name or f"{i}_{p.objective}",
            p.objective,
            list(p.agents or trainable),
            dataclasses.replace(cfg.sft, **p.sft),
            dataclasses.replace(cfg.dpo, **p.dpo),
            p.lr,
        )
        for i, p in enumerate(listed)
    ]


def needs_reference_copies(phases: list[Phase]) -> bool:
    return any(p.objective == "dpo" and p.dpo.reference != "base" for p in phases)


def needs_teacher(phases: list[Phase]) -> bool:
    return any(p.objective == "sft" and p.sft.source == "teacher" for p in phases)
