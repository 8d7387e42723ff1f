"""Advantage estimators and policy losses chosen by name: registries a user can add to.

The config names them as strings (``algorithm.advantage``, ``algorithm.policy_loss``); the code that
uses one looks it up here. A new estimator or loss is a function registered under a new name, never an
``elif`` in shared code (verl's ``register_adv_est`` / ``register_policy_loss`` idea)::

    from roll_ma.algorithms.algorithm_registry import register_policy_loss

    @register_policy_loss("my_loss")
    def my_loss(log_probs, old_log_probs, advantages, mask, algo, denominator, weights):
        ...
        return loss, {"clip_frac": 0.0}

then set ``algorithm.policy_loss: my_loss``. Register in a module the process that uses the name imports:
estimators run in the driver (``algorithms/advantages.py``), policy losses in the train workers.
The built-ins are registered where they are written (``advantages.py``, ``losses.py``); every
lookup site imports that module, so they are always there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

if TYPE_CHECKING:  # the registry itself is plain Python: the config's checks may read its names cheaply
    import numpy as np
    import torch

# "gae" is an estimator too, but it needs a value critic (the train worker builds one when the config
# names it), so it is not a plain function of the returns: algorithms/gae.py, chosen before the lookup
CRITIC_ESTIMATOR = "gae"


class AdvantageEstimator(Protocol):
    """Per-turn advantages from per-turn returns.

    Args:
        returns: (B,) float64 discounted return of each row (one turn of one agent).
        rows: the batch's non-tensor columns, (B,) each: ``agent_id``, ``group_id``, ``episode_id``, ...
        algo: the ``algorithm`` config block (``norm_std``, ``gamma``, ...).

    Returns:
        (B,) float64 advantages (spread over each row's response tokens by the caller).
    """

    def __call__(self, returns: np.ndarray, rows: Mapping[str, np.ndarray], algo: Any, /) -> np.ndarray: ...


class PolicyLoss(Protocol):
    """The policy-gradient loss of one micro-batch; every tensor is (b, R) over response tokens.

    Args:
        log_probs: log pi of the tokens (with grad); old_log_probs: log pi_old (detached).
        advantages: per-token advantages; mask: 1 on the tokens that count (float).
        algo: the ``algorithm`` config block (clip ratios, ``loss_agg``, ...).
        denominator: what the summed loss is divided by (the mini-batch's count over ranks); None: the
            micro-batch's own count.
        weights: (b, R) detached per-token weights (decoupled PPO's importance weights) or None.

    Returns:
        (scalar loss, detached stats); ``stats["clip_frac"]``, if given, is the per-agent clip fraction.
    """

    def __call__(
        self,
        log_probs: torch.Tensor,
        old_log_probs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        algo: Any,
        denominator: float | None,
        weights: torch.Tensor | None,
        /,
    ) -> tuple[torch.Tensor, dict[str, float]]: ...


Fn = TypeVar("Fn", bound=Callable[..., Any])


class Registry(Generic[Fn]):
    """Functions of one kind by name; ``get`` of an unknown name lists the registered ones."""

    def __init__(self, kind: str, config_key: str, register_with: str, also: tuple[str, ...] = ()):
        self.kind, self.config_key, self.register_with = kind, config_key, register_with
        self.also = also  # names the config accepts that are handled before the lookup
        self._table: dict[str, Fn] = {}

    def register(self, name: str) -> Callable[[Fn], Fn]:
        """Decorator: register the function under ``name`` (a second function under one name is an error)."""

        def add(fn: Fn) -> Fn:
            if name in self.also or self._table.get(name, fn) is not fn:
                raise ValueError(f"{self.kind} {name!r} is already registered; pick another name")
            self._table[name] = fn
            return fn

        return add

    def names(self) -> tuple[str, ...]:
        return tuple(sorted((*self._table, *self.also)))

    def unknown(self, name: str) -> str | None:
        """Why ``name`` can't be looked up (None: it can, or it is one of ``also``)."""
        if name in self._table or name in self.also:
            return None
        return (f"{name!r} is no {self.kind} roll_ma knows; registered: {', '.join(self.names())} "
                f"(add one with {self.register_with})")

    def get(self, name: str) -> Fn:
        if name not in self._table:
            why = self.unknown(name) or "handled before the lookup"
            raise ValueError(f"{self.config_key}={name!r}: {why}")
        return self._table[name]


ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry(
    "advantage estimator",
    "algorithm.advantage",
    "roll_ma.algorithms.algorithm_registry.register_advantage_estimator",
    also=(CRITIC_ESTIMATOR,),
)
POLICY_LOSSES: Registry[PolicyLoss] = Registry(
    "policy loss", "algorithm.policy_loss", "roll_ma.algorithms.algorithm_registry.register_policy_loss"
)


def register_advantage_estimator(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator: make an ``AdvantageEstimator`` selectable as ``algorithm.advantage: <name>``."""
    return ADVANTAGE_ESTIMATORS.register(name)


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: make a ``PolicyLoss`` selectable as ``algorithm.policy_loss: <name>``."""
    return POLICY_LOSSES.register(name)
