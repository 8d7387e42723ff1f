"""What the driver builds each role with (``pipelines/clusters.py``), checked without Ray."""

from __future__ import annotations

from roll_ma.config.run_plan import run_plan
from roll_ma.pipelines.clusters import train_worker_spec
from roll_ma.preflight.config_loader import load_config


def test_the_train_workers_spec_is_the_config_as_the_plan_resolved_it():
    cfg = load_config("math_selfplay_tiny", overrides=["train.remove_padding=true", "seed=7"])
    plan = run_plan(cfg)
    spec = train_worker_spec(cfg, plan, reference_copies=True)
    assert cfg.train.share_prompt_prefix == "auto" and spec.train.share_prompt_prefix is plan.shares_prompts
    assert spec.train == plan.worker_train_config(cfg.train)  # nothing else of the block changed
    assert (spec.model, spec.lora, spec.algorithm, spec.critic, spec.study) == (
        cfg.model, cfg.lora, cfg.algorithm, cfg.critic, cfg.study)
    assert spec.agents == tuple(cfg.agents) and spec.seed == 7 and spec.reference_copies
