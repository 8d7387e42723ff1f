"""A user's policy loss and advantage estimator, each a function in a file the config names, train a real
run of the built-in tiny example through Ray workers: every process that calls one imports the file itself.
"""

import os
import re

import pytest
from pipeline_helpers import adapter_tensors_at, same_tensors

from roll_ma.pipelines import run_training
from roll_ma.preflight.config_loader import load_config
from roll_ma.tracking import read_metrics

pytestmark = pytest.mark.slow

# no roll_ma import in the user's file: nothing registers a name, the config's spec alone reaches the workers
USER_ALGOS = '''
import os
from pathlib import Path

import numpy as np

MARKS = Path(__file__).with_name("marks")


def _mark(what):
    MARKS.mkdir(exist_ok=True)
    (MARKS / f"{what}-{os.getpid()}").touch()


def sign_of_return(returns, rows, algo):
    """+1 above the batch mean, -1 below, 0 at it."""
    _mark("estimator")
    return np.sign(returns - returns.mean())


def doubled_pg(log_probs, old_log_probs, advantages, mask, algo, denominator, weights):
    """REINFORCE on the importance ratio, twice over; reports clip_frac 0.25 so the metrics show it ran."""
    _mark("loss")
    ratio = (log_probs - old_log_probs).exp()
    per_token = -2.0 * advantages * ratio * mask
    loss = per_token.sum() / (denominator if denominator is not None else mask.sum().clamp(min=1.0))
    return loss, {"clip_frac": 0.25}
'''


def test_a_policy_loss_and_an_estimator_from_a_users_file_train_through_the_workers(
    ray_session, tmp_path, monkeypatch
):
    (tmp_path / "my_algos.py").write_text(USER_ALGOS)
    monkeypatch.chdir(tmp_path)  # named relative to where the run starts; the workers get it absolute
    cfg = load_config("tiny_hanabi_selfplay", overrides=[
        "algorithm.advantage=my_algos.py:sign_of_return", "algorithm.policy_loss=my_algos.py:doubled_pg",
        "trainer.max_steps=2", "env.groups_per_step=2", "env.group_size=4", "trainer.eval_every=0",
        "trainer.save_every=1", f"trainer.output_dir={tmp_path / 'out'}", "trainer.progress_bars=false",
    ])
    run_training(cfg)

    marks = [re.fullmatch(r"(\w+)-(\d+)", p.name).groups() for p in (tmp_path / "marks").iterdir()]
    loss_pids = {int(pid) for what, pid in marks if what == "loss"}
    estimator_pids = {int(pid) for what, pid in marks if what == "estimator"}
    assert loss_pids and os.getpid() not in loss_pids  # the loss ran in a train worker, not here
    assert estimator_pids == {os.getpid()}  # advantages are computed where the step is driven
    out = tmp_path / "out"
    rows = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    seats = ("player_0", "player_1")
    assert all(r[f"agent/{a}/clip_frac"] == pytest.approx(0.25) for r in rows for a in seats)
    for adapter in ("player_0", "player_1"):
        assert not same_tensors(adapter_tensors_at(out, 1, adapter), adapter_tensors_at(out, 2, adapter))

