"""What the run finds as it starts (a Ray cluster it cannot join, too few GPUs there or too small a node for
each worker's CPUs, no intact checkpoint) reaches a notebook as a ``RunStartError``, never ``SystemExit``;
the CLI prints its one message and exits 1.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from roll_ma import checkpoint as ckpt
from roll_ma.errors import RollMaError, RunStartError


def _too_few_gpus(cfg, monkeypatch) -> None:  # noqa: ANN001
    import ray

    from roll_ma.pipelines.session import check_cluster_gpus

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"GPU": 0})
    check_cluster_gpus(dataclasses.replace(cfg, resources=dataclasses.replace(cfg.resources, num_gpus=1)))


def _too_many_cpus_per_worker(cfg, monkeypatch) -> None:  # noqa: ANN001
    import ray

    from roll_ma.pipelines.session import check_cluster_cpus

    nodes = [{"Alive": True, "Resources": {"CPU": 2.0}}, {"Alive": False, "Resources": {"CPU": 64.0}}]
    monkeypatch.setattr(ray, "nodes", lambda: nodes)  # the dead node's CPUs count for nothing
    check_cluster_cpus(dataclasses.replace(cfg, resources=dataclasses.replace(cfg.resources,
                                                                              num_cpus_per_worker=3)))


def _no_intact_checkpoint(cfg, monkeypatch) -> None:  # noqa: ANN001
    out = Path(cfg.trainer.output_dir)
    for step in (1, 2):
        tmp = ckpt.begin_checkpoint(out, step)
        (tmp / "trainer").mkdir()
        (tmp / "trainer/rank0.pt").write_bytes(b"y" * 32)
        saved = ckpt.finish_checkpoint(tmp, step, {"planner": {}}, keep_last=5)
        (saved / "trainer/rank0.pt").write_bytes(b"")  # damaged: the manifest says 32 bytes
    ckpt.resume_checkpoint(out)


def _refused_join(cfg, monkeypatch) -> None:  # noqa: ANN001
    import ray

    from roll_ma.distributed import ray_env

    def refuse(**kwargs):  # noqa: ANN003, ANN202
        raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")

    monkeypatch.setattr(ray, "init", refuse)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # an earlier test's local Ray may still be up
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    ray_env.init_ray("10.0.0.1:6379")


CASES = {  # what each one printed before as SystemExit("error: ..."), exit code 1: the same now
    "cpus": (_too_many_cpus_per_worker, "resources.num_cpus_per_worker=3 but the largest node of the Ray "
             "cluster has 2 CPUs, so no worker could start; lower it (default 0.1) or add larger nodes"),
    "gpus": (_too_few_gpus, "resources.num_gpus=1 but the Ray cluster has 0 GPUs; lower it or add GPU nodes"),
    "checkpoint": (_no_intact_checkpoint,
                   "no intact checkpoint to resume from in {out}/checkpoints:\n"
                   "  - step_000002: trainer/rank0.pt is 0 bytes, the manifest says 32\n"
                   "  - step_000001: trainer/rank0.pt is 0 bytes, the manifest says 32\n"
                   "Start this run from scratch with trainer.resume=never (moves these checkpoints aside), "
                   "or give it another trainer.output_dir."),
    "join": (_refused_join, "could not join the Ray cluster at 10.0.0.1:6379: Failed to connect to Ray "
             "cluster at 10.0.0.1:6379\nIf the cluster uses token authentication"),
}


@pytest.fixture
def tiny_cfg(tmp_path):
    from roll_ma.preflight.config_loader import load_config

    return load_config("math_selfplay_tiny", None, [f"trainer.output_dir={tmp_path / 'out'}"])


def _starting(case: str, monkeypatch):  # noqa: ANN202
    """run_training up to the library call that finds the problem (the rest of a run is not needed)."""
    import roll_ma.pipelines

    def run_training(cfg, step_hook=None):  # noqa: ANN001, ANN202
        CASES[case][0](cfg, monkeypatch)

    monkeypatch.setattr(roll_ma.pipelines, "run_training", run_training)


@pytest.mark.parametrize("case", sorted(CASES))
def test_train_raises_the_typed_error_not_system_exit(case, tiny_cfg, monkeypatch):
    import roll_ma

    _starting(case, monkeypatch)
    with pytest.raises(RunStartError) as raised:
        roll_ma.train(tiny_cfg)
    assert isinstance(raised.value, RollMaError) and not isinstance(raised.value, SystemExit)
    expected = CASES[case][1].format(out=tiny_cfg.trainer.output_dir)
    assert str(raised.value).startswith(expected)
    assert raised.value.log_path is None  # the message is the whole story: no traceback file named


@pytest.mark.parametrize("case", sorted(CASES))
def test_cli_prints_the_message_it_printed_before_and_exits_1(case, tiny_cfg, monkeypatch, capsys):
    from roll_ma import cli

    _starting(case, monkeypatch)
    assert cli.run(tiny_cfg) == 1
    printed = capsys.readouterr().err
    assert printed.startswith("error: " + CASES[case][1].format(out=tiny_cfg.trainer.output_dir))
    assert "Traceback" not in printed and "full traceback" not in printed
    assert not (Path(tiny_cfg.trainer.output_dir) / "logs").exists()


def test_no_library_module_raises_system_exit():
    """Only the command line ends the process; ``_sandbox_boot`` catches the SystemExit of user code."""
    root = Path(__file__).resolve().parents[2] / "roll_ma"
    raising = [str(p.relative_to(root)) for p in sorted(root.rglob("*.py"))
               if p.name != "cli.py" and "raise SystemExit" in p.read_text()]
    assert raising == []
