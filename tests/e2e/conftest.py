"""What several end-to-end tests read: one toy run trained once per session, in this process (sharing the
session's Ray), instead of once per test. The tests call ``run_training`` as an entry point does, so the
studies are wired in as the entry points wire them (``roll_ma.run``: ``import roll_ma.studies``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pipeline_helpers import TOY_AGENTS, TOY_STEPS, load, toy_config

import roll_ma.studies  # noqa: F401  (the joint search's step kind, the action entropy bonus, ...)


@pytest.fixture(scope="session")
def toy_run(ray_session, tiny_model_dir, tmp_path_factory) -> Path:
    """The output folder of the DigitGame run of alice and bob: toy_config's settings, TOY_STEPS steps, a
    checkpoint every step (all kept). Tests read it and never write into it: copy it to change it."""
    from roll_ma.pipelines import run_training

    root = tmp_path_factory.mktemp("toy_run")
    run_training(load(root, toy_config(root, tiny_model_dir, TOY_AGENTS, trainer={"max_steps": TOY_STEPS})))
    return root / "out"
