"""The synchronous RL step's stages without Ray: roll out, score, advantages, update, sync, record.

The run is a real ``RunSession`` and ``RLRun`` (``prepare_rl_run``: the real ``AdapterSync`` and
``RolloutQueue``) over fake workers behind the real typed clients (a ``LocalCluster`` each). The fakes
have no model: the env plays one turn per agent per episode and reports the adapter versions the fake
engine serves, the trainer records what it is asked and reports which agents took an optimizer step.
Whole runs with the real workers are in tests/e2e.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from local_cluster import LocalCluster
from pipeline_helpers import load, toy_config

from roll_ma.config.run_plan import run_plan
from roll_ma.config.schema import RunConfig
from roll_ma.pipelines.clusters import RunWorkers
from roll_ma.pipelines.rl.rl_run import RLRun, prepare_rl_run
from roll_ma.pipelines.rl.stages import roll_out, score, update_request
from roll_ma.pipelines.rl.step import synchronous_step
from roll_ma.pipelines.session import RunSession
from roll_ma.pipelines.step_timer import StepTimer
from roll_ma.protocol import DataProto
from roll_ma.protocol.requests import ScoreRequest, UpdateRequest, UpdateResult
from roll_ma.tracking import Tracker, read_metrics
from roll_ma.workers.clients import EnvClient, ReferenceClient, RolloutClient, TrainClient
from roll_ma.workers.env_worker import EnvWorker
from roll_ma.workers.episodes import EpisodePlanner
from roll_ma.workers.reference_worker import ReferenceWorker
from roll_ma.workers.rollout_worker import RolloutWorker
from roll_ma.workers.train_worker import TrainWorker

R = 2  # response tokens of every row
SHAPE = {"layers": 2, "hidden": 16, "heads": 2, "kv_heads": 2, "head_dim": 8, "intermediate": 32, "vocab": 64}


class Engine:
    """The rollout workers: the adapter versions they serve, and every install."""

    def __init__(self) -> None:
        self.versions: dict[str, int] = {}
        self.installs: list[tuple[list[str], int]] = []
        self.events: list[str] = []  # sleeps, wake-ups and installs, in order

    def node_id(self) -> str:
        return "node-0"

    def update_adapters(self, tensors: dict, version: int) -> dict[str, float]:
        self.installs.append((sorted(tensors), version))
        self.events.append(f"install {version}")
        self.versions.update({name: version for name in tensors})
        return {name: 0.0 for name in tensors}

    def last_sync_profile(self) -> dict[str, float]:
        return {}

    def adapter_versions(self) -> dict[str, int]:
        return dict(self.versions)

    def sleep(self, level) -> None:
        self.events.append(f"sleep {level}")

    def wake_up(self) -> None:
        self.events.append("wake_up")


class Table:
    """The env workers: each episode is one turn of every agent, played with the engine's adapters."""

    def __init__(self, cfg: RunConfig) -> None:
        self.agents = cfg.agents

    def run_episodes(self, rollout, assignments, step, greedy=False, seats=None) -> DataProto:
        served = rollout.worker.versions  # the engine behind the rollout transport the env workers got
        specs = [s for part in assignments for s in part]
        rows = [(s, seat, a) for s in specs for seat, a in enumerate(self.agents)]
        n = len(rows)
        tensors = {
            "attention_mask": torch.ones(n, 3 + R, dtype=torch.long),
            "response_mask": torch.ones(n, R),
            "rollout_log_probs": torch.zeros(n, R),
            "scores": torch.tensor([float((i * 7 + step) % 3) for i in range(n)]),
        }
        non_tensor = {
            "agent_id": [seat for _, seat, _ in rows], "player": [seat for _, seat, _ in rows],
            "episode_id": [s.episode_id for s, _, _ in rows], "group_id": [s.group_id for s, _, _ in rows],
            "turn": [0] * n, "adapter_version": [served[a.adapter_name] for _, _, a in rows],
            "format_error": [False] * n, "prompt_truncated": [False] * n,
        }
        episodes = [{"turns": len(self.agents), "truncated": False, "returns": [0.0] * len(self.agents),
                     "metrics": {"won": 1.0}} for _ in specs]
        return DataProto.from_dict(tensors, non_tensor, meta_info={"episodes": episodes})


class Trainer:
    """The train workers: the requests they get; ``stepped`` names the agents whose update takes an
    optimizer step (none while only the critic trains, as the real worker does)."""

    def __init__(self, cfg: RunConfig, stepped: set[str]) -> None:
        self.names, self.stepped = [a.name for a in cfg.agents], stepped
        self.requests: list[UpdateRequest] = []
        self.scored: list[str] = []

    def node_id(self) -> str:
        return "node-0"

    def flops_profile(self) -> dict:
        return {"shape": SHAPE, "peak_flops": 0.0}

    def export_adapters(self, adapters, dtype=None, transport="ray"):
        return {a: SimpleNamespace(segment=f"shm-{a}") for a in adapters}, 0.0

    def release_exports(self, segments=None) -> int:
        return len(segments or [])

    def _zeros(self, key: str, data: DataProto) -> DataProto:
        self.scored.append(key)
        return DataProto.from_dict({key: torch.zeros(len(data), R)})

    def compute_log_probs(self, data: DataProto, request: ScoreRequest) -> DataProto:
        return self._zeros("old_log_probs", data)

    def compute_ref_log_probs(self, data: DataProto, request: ScoreRequest) -> DataProto:
        return self._zeros("ref_log_probs", data)

    def compute_values(self, data: DataProto) -> DataProto:
        return self._zeros("values", data)

    def train_step(self, data: DataProto, request: UpdateRequest) -> UpdateResult:
        self.requests.append(request)
        took = {n: float(n in self.stepped and not request.critic_only) for n in self.names}
        metrics = {**{f"agent/{n}/updated": v for n, v in took.items()},
                   **{f"agent/{n}/tokens": float(R * 8) for n in self.names}}
        stepped = tuple(i for i, n in enumerate(self.names) if took[n])
        return UpdateResult(metrics, stepped, tuple(self.names[i] for i in stepped))


class Alone:
    """Placement of the fakes: the rollout and the trainer on separate devices (nothing sleeps)."""

    def colocated(self, *roles: str) -> bool:
        return False


class Together(Alone):
    """The rollout and the trainer on one device: the engine sleeps while the trainer works."""

    def colocated(self, *roles: str) -> bool:
        return True


def make_run(tmp_path: Path, stepped: frozenset[str] = frozenset({"alice", "bob"}),
             placement: Alone | None = None, bob: dict | None = None, **sections) -> tuple[RLRun, dict]:
    """A prepared run of agents alice and bob (first sync done) over the fakes, and the fakes by role;
    ``bob``: bob's own settings (``update_every``)."""
    sections.setdefault("algorithm", {"kl_coef": 0.0})
    agents = [{"name": "alice"}, {"name": "bob", **(bob or {})}]
    cfg = load(tmp_path, toy_config(tmp_path, "builtin:tiny", agents,
                                    trainer={"max_steps": 3, "eval_every": 0, "save_every": 0}, **sections))
    fakes = {"engine": Engine(), "trainer": Trainer(cfg, set(stepped)), "reference": Trainer(cfg, set())}
    reference = None
    if cfg.reference.mode == "worker":
        reference = ReferenceClient(LocalCluster(fakes["reference"], ReferenceWorker, "reference"))
    workers = RunWorkers(
        rollout=RolloutClient(LocalCluster(fakes["engine"], RolloutWorker, "rollout")),
        train=TrainClient(LocalCluster(fakes["trainer"], TrainWorker, "train")),
        reference=reference,
        env=EnvClient(LocalCluster(Table(cfg), EnvWorker, "env")),
        resources=placement or Alone(),  # type: ignore[arg-type]
    )
    out = Path(cfg.trainer.output_dir)
    session = RunSession(cfg, run_plan(cfg), out, {}, ["alice", "bob"], EpisodePlanner(cfg.env, cfg.seed),
                         workers, StepTimer("startup"), resume_from=None,
                         opened_tracker=Tracker(out, cfg.tracking, cfg.name, {}))
    return prepare_rl_run(session), fakes


@pytest.mark.parametrize(
    ("sections", "scorer"),
    [
        ({"algorithm": {"kl_coef": 0.0}, "reference": {"mode": "train_worker"}}, None),
        ({"algorithm": {"kl_coef": 0.1}, "reference": {"mode": "train_worker"}}, "trainer"),
        ({"algorithm": {"kl_coef": 0.1}, "reference": {"mode": "worker"}}, "reference"),
    ],
    ids=["kl_coef=0: no pass", "adapters off on the train workers", "the reference workers"],
)
def test_the_reference_pass_runs_only_where_a_loss_reads_it_and_on_the_workers_the_config_names(
    tmp_path, sections, scorer
):
    run, fakes = make_run(tmp_path, **sections)
    timer = StepTimer()
    batch, _ = roll_out(run, 1, timer)
    scored, _, _ = score(run, batch, 1, timer)
    asked = {name for name in ("trainer", "reference") if "ref_log_probs" in fakes[name].scored}
    assert asked == ({scorer} if scorer else set())
    assert ("ref_log_probs" in scored.batch.keys()) == (scorer is not None)
    assert ("timing/reference" in timer.times) == (scorer is not None)


def test_during_the_critics_warmup_the_update_asks_for_the_critic_only_and_no_adapter_is_pushed(tmp_path):
    gae = {"advantage": "gae", "kl_coef": 0.0}
    run, fakes = make_run(tmp_path, algorithm=gae, critic={"warmup_steps": 1})
    engine, trainer = fakes["engine"], fakes["trainer"]
    assert engine.installs == [(["alice", "bob"], 0)]  # the first sync, before any step
    assert update_request(run, 1, behavior_correction=False).critic_only
    synchronous_step(run, 1)
    assert "values" in trainer.scored  # GAE: the critic's values before the advantages
    assert trainer.requests[-1].critic_only and not trainer.requests[-1].behavior_correction
    assert engine.installs == [(["alice", "bob"], 0)] and run.served == {"alice": 0, "bob": 0}
    synchronous_step(run, 2)  # warm-up over: the agents train, and the engines get version 2
    assert not trainer.requests[-1].critic_only and trainer.requests[-1].step == 2
    assert engine.installs[-1] == (["alice", "bob"], 2) and run.served == {"alice": 2, "bob": 2}


def test_the_agents_due_reach_the_train_workers_from_the_plan_the_driver_scores_the_idle_ones_by(tmp_path):
    """bob trains every second step: the update request names the run plan's due agents (the train workers
    apply no cycle of their own), and the driver's idle agents, whose rows it scores, are the rest."""
    run, fakes = make_run(tmp_path, bob={"update_every": 2})
    for step in (1, 2, 3):
        synchronous_step(run, step)
        assert fakes["trainer"].requests[-1].agents == run.plan.due_agents(step)
    assert [r.agents for r in fakes["trainer"].requests] == [(0,), (0, 1), (0,)]
    assert run.plan.idle_agents(1) == [1] and run.plan.idle_agents(2) == []


def test_only_the_adapters_that_took_a_step_are_pushed_and_the_next_rollout_expects_their_versions(tmp_path):
    run, fakes = make_run(tmp_path, stepped=frozenset({"alice"}))
    engine = fakes["engine"]
    metrics = synchronous_step(run, 1)
    assert engine.installs[-1] == (["alice"], 1) and metrics["rollout/adapters_synced"] == 1.0
    assert run.served == {"alice": 1, "bob": 0}  # bob's engine copy is still version 0, and says so
    second = synchronous_step(run, 2)  # its rows report alice 1, bob 0: not stale
    assert second["agent/alice/adapter_version"] == 1.0 and second["agent/bob/adapter_version"] == 0.0
    assert second["rollout/stale_rows"] == 0.0


def test_a_row_from_an_older_adapter_stops_the_step_before_the_update(tmp_path):
    run, fakes = make_run(tmp_path)
    synchronous_step(run, 1)
    fakes["engine"].versions["bob"] = 0  # an engine that kept serving bob's adapter of before step 1
    with pytest.raises(RuntimeError, match=r"the rollout used a stale adapter \(8 rows"):
        synchronous_step(run, 2)
    assert [r.step for r in fakes["trainer"].requests] == [1]  # step 2 trained on nothing


def test_record_writes_the_steps_metrics_as_one_line_of_metrics_jsonl(tmp_path, capsys):
    run, _ = make_run(tmp_path)
    metrics = synchronous_step(run, 1)
    synchronous_step(run, 2)
    lines = read_metrics(Path(run.cfg.trainer.output_dir) / "metrics.jsonl")
    assert [line["step"] for line in lines] == [1, 2]
    first = lines[0]
    for key in ("agent/alice/reward", "agent/bob/updated", "rollout/env/won", "timing/update", "timing/sync",
                "timing/step_wall", "system/train_tokens_per_s", "startup/first_sync"):
        assert key in first, key
    assert first["agent/alice/reward"] == pytest.approx(metrics["agent/alice/reward"])
    assert "startup/first_sync" not in lines[1]  # the start-up joins the first step's line only
    out = capsys.readouterr().out  # trainer.log_every=1: each step's block on the console
    assert "step 1/3" in out and "step 2/3" in out


@pytest.mark.parametrize("level", [1, "kv_cache", 0])
def test_a_colocated_engine_sleeps_at_its_level_after_the_rollout_and_wakes_before_the_install(
    tmp_path, level
):
    run, fakes = make_run(tmp_path, placement=Together(), rollout={"sleep_level": level})
    engine = fakes["engine"]
    engine.events.clear()  # the first sync's install
    metrics = synchronous_step(run, 1)
    sleeps = [f"sleep {level}", "wake_up"] if level != 0 else []
    assert engine.events == [*sleeps, "install 1"]
    assert ("timing/sleep" in metrics) == (level != 0)

