"""action_entropy: the entropy bonus over a game's legal actions (``study.action_entropy_coef``).

At a decision with two or more legal actions, the policy's choice among them is scored whole: the
log-probability of each action's answer after the prompt (``choice_log_probs``), renormalised over the
legal ones (``choice_entropy``). The PPO loss subtracts ``coef * mean entropy over the mini-batch's
decisions``; ``coef`` decays with ``algorithm.entropy_decay_steps`` like ``algorithm.entropy_coef``. It costs
a forward per legal action, so it runs only while on. The env workers put each row's legal answers, as
token ids, in the rows (``action_choices``) while the bonus is on.

It plugs into the PPO objective as an extra loss term (``training/update_loop.py``: ``LossTerm``): the driver
hands ``action_entropy_bonus`` to the train workers (``roll_ma.studies`` registers it; the run plan names it
where the config turns it on). Reported per agent: ``action_entropy``, the mean over its decisions.
"""

from __future__ import annotations

import numpy as np
import torch

from roll_ma.algorithms.losses import choice_entropy, entropy_coef_at
from roll_ma.models.logprobs import choice_log_probs
from roll_ma.protocol import DataProto
from roll_ma.training.policy_engine import PolicyEngine
from roll_ma.training.update_loop import TermPart, UpdateContext

SUM_FIELDS = ("action_entropy", "choice_rows")  # per agent: entropy summed over its decisions; decisions


class ActionEntropyBonus:
    """The action entropy bonus of one policy update (a ``LossTerm``).

    Args:
        engine: the policy being trained (its forward scores the answers).
        rows: the update's rows, with ``action_choices`` (per row: token ids of each legal action's answer).
        coef: the bonus's weight at this step (> 0).
        temperature: the rollout's sampling temperature.
    """

    sum_fields: tuple[str, ...] = SUM_FIELDS

    def __init__(self, engine: PolicyEngine, rows: DataProto, coef: float, temperature: float):
        if "action_choices" not in rows.non_tensor:
            raise ValueError(
                "study.action_entropy_coef > 0 but the rows carry no 'action_choices' "
                "(env workers fill them for games when the bonus is on)"
            )
        self.engine, self.coef, self.temperature = engine, coef, temperature
        self.choices = [list(c) for c in rows.non_tensor["action_choices"]]  # (N,) rows of answers of ids
        self.has_choice = np.array([len(c) >= 2 for c in self.choices], dtype=np.float32)  # (N,)
        self.counts = self.has_choice.astype(np.float64)  # (N,) the bonus is a mean over decisions
        self.input_ids, self.attention_mask = rows.batch["input_ids"], rows.batch["attention_mask"]  # (N, T)
        self.prompt_len = self.input_ids.shape[1] - rows.batch["responses"].shape[1]

    def micro_loss(self, idx: torch.Tensor, real: torch.Tensor, local_denom: float) -> TermPart:
        """Minus ``coef`` x the entropy of rows ``idx``'s choices (summed over decisions) / local_denom."""
        dev = self.engine.device
        has_choice = torch.from_numpy(self.has_choice[idx.numpy()]).to(dev)  # (b,)
        choice_rows = has_choice * real.to(dev)  # (b,) real rows with two or more legal actions
        entropy = self._choice_entropy(idx)  # (b,)
        loss = -self.coef * (entropy * choice_rows).sum() / local_denom
        row_sums = {"action_entropy": entropy.detach() * choice_rows, "choice_rows": choice_rows}
        return TermPart(loss, row_sums)

    def _choice_entropy(self, idx: torch.Tensor) -> torch.Tensor:
        """(b,) entropy of each row's choice among its legal actions, under the policy being trained."""
        dev = self.engine.device
        prompt_ids = self.input_ids[idx, : self.prompt_len].to(dev)  # (b, P) left-padded
        prompt_mask = self.attention_mask[idx, : self.prompt_len].to(dev)  # (b, P)
        lp, mask = choice_log_probs(
            self.engine.engine, prompt_ids, prompt_mask, [self.choices[int(i)] for i in idx], self.temperature
        )  # (b, K) each
        return choice_entropy(lp, mask)

    def agent_metrics(self, sums: dict[str, float]) -> dict[str, float]:
        """``action_entropy``: the mean over the agent's decisions (none: not reported)."""
        if sums["choice_rows"] <= 0:
            return {}
        return {"action_entropy": sums["action_entropy"] / sums["choice_rows"]}


def action_entropy_bonus(engine: PolicyEngine, rows: DataProto,
                         ctx: UpdateContext) -> ActionEntropyBonus | None:
    """The bonus of this update (a ``LossTermMaker``), or None while its decayed weight is 0."""
    coef = entropy_coef_at(ctx.study_cfg.action_entropy_coef, ctx.algo_cfg.entropy_decay_steps, ctx.step)
    if coef <= 0:
        return None
    return ActionEntropyBonus(engine, rows, coef, ctx.temperature)
