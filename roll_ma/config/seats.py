"""Who sits in each seat of the env: a rule of the config alone, shared by its checks and the pipelines."""

from __future__ import annotations

from roll_ma.config.schema import RunConfig


def resolve_seats(cfg: RunConfig, num_players: int | None) -> list[str]:
    """Agent name per seat: env.seats, else agents in order, else one agent in every seat."""
    if cfg.env.seats is not None:
        return list(cfg.env.seats)
    names = [a.name for a in cfg.agents]
    if num_players is None or len(names) == num_players:
        return names
    if len(names) == 1:
        return names * num_players
    return names
