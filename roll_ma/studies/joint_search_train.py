"""joint_search_train: the joint policy search's passes over the train worker's policy set
(``study.joint_search_every``).

``score_choices`` scores every legal answer of each row under its agent's adapter; ``distill_choices``
teaches each policy the answers the search found, from its own agents' rows only and with its own
optimizer (``PolicyEngine.distill``). They read the policy set only through ``model``, ``weights``,
``device``, ``agents``, ``plans``, ``updaters``, ``agent_ids`` and ``scoring_groups``. The core imports none
of this: the driver's joint-search step hands each function to the train worker with its call
(``TrainWorker.score_with`` / ``train_with``), which passes its backend; a backend that is no policy set is
refused by name.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from roll_ma.models.logprobs import choice_log_probs
from roll_ma.protocol import DataProto
from roll_ma.training.policy_set import PolicySet
from roll_ma.training.scoring import check_columns


def policy_set(backend: Any) -> PolicySet:
    """The train backend as a policy set, which the joint search's passes read; else a ValueError naming the
    strategy and the fix."""
    if not isinstance(backend, PolicySet):
        raise ValueError(f"study.joint_search_every > 0: the joint search scores and distills into a policy "
                         f"set (train.strategy multi_agent_deepspeed or deepspeed_train), not a "
                         f"{type(backend).__name__}; use one of those or set study.joint_search_every=0")
    return backend


def _choice_rows(data: DataProto) -> tuple[torch.Tensor, torch.Tensor, list[list[list[int]]]]:
    check_columns(data, ("input_ids", "attention_mask"), "score the answers of")
    if "action_choices" not in data.non_tensor:
        raise ValueError("the rows carry no 'action_choices' (token ids of every legal answer)")
    choices = [list(c) for c in data.non_tensor["action_choices"]]
    return data.batch["input_ids"], data.batch["attention_mask"], choices


def score_choices(backend: Any, data: DataProto) -> DataProto:
    """(B, K) ``choice_log_probs``: log pi(answer | prompt) of each row's legal answers under its
    agent's adapter (-inf past a row's own answers). Rows are prompts only (left-padded)."""
    policies = policy_set(backend)
    policies.require_model()
    ids, mask, choices = _choice_rows(data)
    width = max((len(c) for c in choices), default=0)
    out = torch.full((len(data), width), float("-inf"), dtype=torch.float32)  # (B, K)
    policies.model.eval()
    policies.weights.activate(None)
    for name, idx in (policies.scoring_groups(policies.agent_ids(data)) if len(data) else {}).items():
        sel = torch.from_numpy(idx)
        with policies.weights.scoring(name), torch.no_grad():
            lp, real = choice_log_probs(policies.model, ids[sel].to(policies.device),
                                        mask[sel].to(policies.device), [choices[i] for i in idx])
        out[sel, : lp.shape[1]] = lp.float().cpu().masked_fill(real.cpu() == 0, float("-inf"))
    return DataProto.from_dict({"choice_log_probs": out}, meta_info=data.meta_info)


def distill_choices(backend: Any, data: DataProto, max_steps: int, stop_prob: float) -> dict[str, float]:
    """Teach every row's agent the answer ``target_action`` (index into its legal answers).

    Each policy learns from its own agents' rows only, with its own optimizer (see
    ``PolicyEngine.distill``). Returns ``<adapter>/<metric>`` per policy trained.
    """
    policies = policy_set(backend)
    policies.require_model()
    ids, mask, choices = _choice_rows(data)
    if "target_action" not in data.non_tensor:
        raise ValueError("the rows carry no 'target_action' (the answer each row should learn)")
    targets = torch.tensor([int(t) for t in data.non_tensor["target_action"]], dtype=torch.long)
    agent_ids = policies.agent_ids(data)
    trained = {a for plan in policies.plans for a in plan.agent_ids}
    frozen = sorted({policies.agents[a].name for a in agent_ids.tolist() if a not in trained})
    if frozen:
        raise ValueError(f"rows of frozen agents {frozen} cannot be distilled into their adapters")
    metrics: dict[str, float] = {}
    for plan in policies.plans:
        idx = np.nonzero(np.isin(agent_ids, plan.agent_ids))[0]
        if len(idx) == 0:
            continue
        sel = torch.from_numpy(idx)
        result = policies.updaters[plan.name].distill(
            ids[sel], mask[sel], [choices[i] for i in idx], targets[sel], max_steps, stop_prob)
        metrics.update({f"{plan.name}/{k}": v for k, v in result.items()})
    policies.weights.activate(None)
    return metrics
