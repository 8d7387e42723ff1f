"""A run whose env worker gets stuck stops with an error naming the role, rank, last report and logs."""

import pytest
from pipeline_helpers import load, toy_config

from roll_ma.distributed.cluster import WorkerStalled
from roll_ma.pipelines import run_training

pytestmark = pytest.mark.slow


@pytest.mark.timeout(600)
def test_a_stuck_env_worker_stops_the_run_instead_of_hanging(ray_session, tiny_model_dir, tmp_path):
    # 30 s: longer than any silent phase of a healthy tiny run on a busy 2-core machine
    cfg = toy_config(tmp_path, tiny_model_dir, [{"name": "alice"}, {"name": "bob"}],
                     env={"name": "toy_envs:StuckGame"}, trainer={"stall_timeout_s": 30})
    with pytest.raises(WorkerStalled) as err:
        run_training(load(tmp_path, cfg))
    text = str(err.value)
    assert text.startswith("env worker rank 0 made no progress for"), text
    assert "in run_episodes() (trainer.stall_timeout_s=30)" in text, text
    # the last thing it did: it got the rollout workers' answers and stepped the envs with them
    assert '"rollout step 1: round 0, stepping 8 envs with the answers"' in text, text
    assert "logs: " in text and "/logs/worker-*-" in text, text
