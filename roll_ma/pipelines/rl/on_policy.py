"""Whether a step needs its own pass for pi_old, or can take it from the update's first forward.

In a strictly on-policy step (one optimizer step per policy: one PPO epoch, one mini-batch, rows
from the adapters being trained) every micro-batch of the update runs on the weights that
generated the rows, so log pi_old equals the update's own log pi, detached: the PPO ratio is
exactly 1 and its gradient is the plain policy gradient. verl does the same. The separate
scoring pass is then a forward over every token for nothing (~12 s of an 88 s 7B step).
"""

from __future__ import annotations

from roll_ma.config.run_plan import RunPlan
from roll_ma.config.schema import RunConfig


def old_log_probs_pass_reason(cfg: RunConfig, plan: RunPlan, num_rows: int) -> str | None:
    """Why this step must score pi_old before the update (None: the update provides it); ``plan``: the
    run's plan (each agent's LoRA settings).

    ``num_rows``: rows of the step's batch (a mini-batch smaller than a policy's rows means
    several optimizer steps, after the first of which the weights no longer are pi_old).
    """
    if not cfg.train.reuse_update_log_probs:
        return "train.reuse_update_log_probs=false"
    if cfg.rollout.max_staleness > 0:
        return "rollout.max_staleness > 0 (rows of older adapters: pi_old is the proximal policy)"
    if cfg.train.ppo_epochs > 1:
        return "train.ppo_epochs > 1"
    if cfg.train.mini_batch_size is not None and cfg.train.mini_batch_size < num_rows:
        return "train.mini_batch_size below the step's rows (several optimizer steps)"
    if cfg.algorithm.kl_coef > 0 and cfg.algorithm.kl_mode == "reward":
        return "algorithm.kl_mode=reward (the advantages need pi_old before the update)"
    if any(a.lora.dropout > 0 for a in plan.agents):  # the update's forward is not the scoring one
        return "LoRA dropout > 0"
    return None

