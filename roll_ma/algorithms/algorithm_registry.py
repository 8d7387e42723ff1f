"""Advantage estimators and policy losses chosen by the config: two ``roll_ma.registry.Registry``.

A new estimator or loss is a function, never an ``elif`` in shared code (verl's ``register_adv_est`` /
``register_policy_loss`` idea). Name it in the config by its file or module, and every process that
calls it (the driver for estimators, each train worker for policy losses) imports it from there::

    # my_losses.py
    def my_loss(log_probs, old_log_probs, advantages, mask, algo, denominator, weights):
        ...
        return loss, {"clip_frac": 0.0}

    algorithm.policy_loss: path/to/my_losses.py:my_loss      # or my_pkg.my_losses:my_loss

A short name registered with ``@register_policy_loss("my_loss")`` also works, but only in processes that
import the module holding the decorator (a package your workers import on start); the spec needs nothing.
The built-ins are listed below as import paths, so every process knows them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from roll_ma.registry import Registry, takes_positional

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


ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry(
    "advantage estimator",
    "algorithm.advantage",
    "roll_ma.algorithms.algorithm_registry.register_advantage_estimator",
    also=(CRITIC_ESTIMATOR,),
    builtins={
        "grpo": "roll_ma.algorithms.advantages:grpo_estimator",
        "reinforce_pp": "roll_ma.algorithms.advantages:reinforce_pp_estimator",
    },
    check=takes_positional("returns", "rows", "algo"),
)
POLICY_LOSSES: Registry[PolicyLoss] = Registry(
    "policy loss",
    "algorithm.policy_loss",
    "roll_ma.algorithms.algorithm_registry.register_policy_loss",
    builtins={"ppo_clip": "roll_ma.algorithms.losses:ppo_clip_policy_loss"},
    check=takes_positional(
        "log_probs", "old_log_probs", "advantages", "mask", "algo", "denominator", "weights"
    ),
)


def register_advantage_estimator(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator: make an ``AdvantageEstimator`` selectable as ``algorithm.advantage: <name>``."""
    return ADVANTAGE_ESTIMATORS.register(name)


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: make a ``PolicyLoss`` selectable as ``algorithm.policy_loss: <name>``."""
    return POLICY_LOSSES.register(name)
