"""A user's rollout backend and train backend, each a class in a file the config names ('path/file.py:Name'),
run a real tiny run through Ray workers: every worker resolves the spec itself and builds the user's class.
"""

import os
import re

import pytest

from roll_ma.pipelines import run_training
from roll_ma.preflight.config_loader import load_config
from roll_ma.tracking import read_metrics

pytestmark = pytest.mark.slow

# subclasses of the built-ins that leave a mark (what ran, in which process) each time they are called
USER_BACKENDS = '''
import os
from pathlib import Path

from roll_ma.inference.hf_infer import HFInferStrategy
from roll_ma.training.multi_agent_deepspeed import MultiAgentDeepSpeedStrategy

MARKS = Path(__file__).with_name("marks")


def _mark(what):
    MARKS.mkdir(exist_ok=True)
    (MARKS / f"{what}-{os.getpid()}").touch()


class MarkedRollout(HFInferStrategy):
    def generate(self, data, request):
        _mark("generate")
        return super().generate(data, request)


class MarkedTrainer(MultiAgentDeepSpeedStrategy):
    def train_step(self, data, *args, **kwargs):
        _mark("train_step")
        return super().train_step(data, *args, **kwargs)
'''


def test_a_rollout_and_a_train_backend_from_a_users_file_run_in_the_workers(
    ray_session, tmp_path, monkeypatch
):
    (tmp_path / "my_backends.py").write_text(USER_BACKENDS)
    monkeypatch.chdir(tmp_path)  # named relative to where the run starts; the workers get it absolute
    cfg = load_config("tiny_hanabi_selfplay", overrides=[
        "rollout.backend=my_backends.py:MarkedRollout", "train.strategy=my_backends.py:MarkedTrainer",
        "trainer.max_steps=2", "env.groups_per_step=2", "env.group_size=4", "trainer.eval_every=0",
        "trainer.save_every=0", f"trainer.output_dir={tmp_path / 'out'}", "trainer.progress_bars=false",
    ])
    run_training(cfg)

    marks = [re.fullmatch(r"(\w+)-(\d+)", p.name).groups() for p in (tmp_path / "marks").iterdir()]
    generate_pids = {int(pid) for what, pid in marks if what == "generate"}
    train_pids = {int(pid) for what, pid in marks if what == "train_step"}
    assert generate_pids and os.getpid() not in generate_pids  # the rollout workers built the user's class
    assert train_pids and os.getpid() not in train_pids  # so did the train workers
    assert not generate_pids & train_pids  # each in its own worker process
    assert [r["step"] for r in read_metrics(tmp_path / "out" / "metrics.jsonl")] == [1, 2]
