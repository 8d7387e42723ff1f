"""dpo_reference: DPO's reference, a frozen copy of every trainable adapter on the same base (or the base).

The copies are injected with the adapters when the policy set is built (``policy_plan.reference_copy_names``:
every trainable adapter, when the run asks for reference copies); ``snapshot_reference`` copies the adapters
as they are into them when a phase (or iteration) starts, and ``pair_ref_log_probs`` scores the chosen and
rejected side of each pair under its row's copy, or under the base with every adapter off. No second model.
They read the policy set only through ``model``, ``weights``, ``train_cfg``, ``device``, ``agent_ids``,
``scoring_groups`` and ``copied_adapters``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from roll_ma.algorithms.preference import sequence_log_probs
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import PairReference
from roll_ma.training.micro_batches import MicroBatching
from roll_ma.training.objective_dpo import REF_KEYS, SIDES, side
from roll_ma.training.policy_weights import LoraWeights
from roll_ma.training.scoring import score_rows

if TYPE_CHECKING:
    from roll_ma.training.policy_set import PolicySet


def _lora_weights(policies: PolicySet, what: str) -> LoraWeights:
    """The policies' LoRA adapters; full fine-tuning has none (and no reference copies)."""
    if not isinstance(policies.weights, LoraWeights):
        raise ValueError(f"{what} needs LoRA adapters; train.full_finetune trains the base weights")
    return policies.weights


def pair_ref_log_probs(policies: PolicySet, data: DataProto, reference: PairReference = "copy") -> DataProto:
    """(N,) ``ref_chosen_logps`` and ``ref_rejected_logps`` of DPO pair rows: summed response log-probs
    under each row's frozen adapter copy (``reference="copy"``) or the base with adapters off ("base")."""
    policies.require_model()
    if reference not in ("copy", "base"):
        raise ValueError(f"reference must be 'copy' or 'base', got {reference!r}")
    n = len(data)
    out = {k: torch.zeros(n, dtype=torch.float32) for k in REF_KEYS}
    policies.model.eval()
    policies.weights.activate(None)
    batching = MicroBatching.for_scoring(policies.train_cfg)
    groups = policies.scoring_groups(policies.agent_ids(data)) if n else {}
    for name, idx in groups.items():
        scorer: str | None = None  # "base": adapters off
        if reference == "copy":
            scorer = _lora_weights(policies, "reference='copy'").reference_copy(name)
        for key, which in zip(REF_KEYS, SIDES, strict=True):
            rows = side(data.select_idxs(idx), which)
            with policies.weights.scoring(scorer):
                lp, _ = score_rows(policies.model, rows, batching, policies.device)
            out[key][torch.from_numpy(idx)] = sequence_log_probs(lp, rows.batch["response_mask"].float())
    policies.weights.activate(None)
    return DataProto.from_dict(out, meta_info=data.meta_info)


def snapshot_reference(policies: PolicySet) -> list[str]:
    """Copy every trainable adapter into its frozen reference copy (DPO: a phase or iteration starts)."""
    policies.require_model()
    names = policies.copied_adapters
    if not names:
        raise ValueError("this strategy was built without reference copies (reference_copies=False)")
    weights = _lora_weights(policies, "snapshot_reference")
    for name in names:
        weights.snapshot(name)
    policies.weights.activate(None)
    return list(names)
