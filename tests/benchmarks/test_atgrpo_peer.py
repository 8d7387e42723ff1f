"""benchmarks/peers' AT-GRPO port (issue 60, stage 1: one shared LoRA): the relay game it plays (the prompts
of each turn are SeatGame relay's, the earlier replies carried), its rows and AT-GRPO groups (game, turn,
seat), the runner's overrides and refusals from the job's row, and run_all's plan for it. The verl side (the
agent loop, the worker that writes each turn row's uid and reward, verl's GRPO over those uids, verl's own
TransferQueue in a slow test) runs where verl 0.9.1 imports (with its dependencies; CPU is enough) and is
skipped otherwise."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from pathlib import Path

import pytest

PEERS = Path(__file__).resolve().parents[2] / "benchmarks" / "peers"
sys.path[:0] = [str(PEERS), str(PEERS.parent)]

import atgrpo_game  # noqa: E402
import job as peer_job  # noqa: E402
import run_all  # noqa: E402
import run_atgrpo  # noqa: E402
import run_verl  # noqa: E402
from seat_game import SeatGame  # noqa: E402


@pytest.fixture(scope="module")
def relay():
    return peer_job.load_job(PEERS / "relay.yaml")


def _reply(turn: int, copy: int) -> str:
    """A made-up reply whose digit share differs by turn and by copy (a turn row with the last turn's reward,
    or GRPO over the wrong rows, then shows)."""
    return "seat says " + "7" * (2 * turn + copy + 1)


def _play(spec, copy=0):
    """Play ``spec`` with made-up replies: (the prompts asked, the rows); each output names the seat asked."""
    seen: list[list[dict]] = []

    async def generate(messages, seat):
        seen.append(messages)
        return {"turn": len(seen) - 1, "seat": seat}, _reply(len(seen) - 1, copy)

    return seen, asyncio.run(atgrpo_game.play(spec, generate))


# ---------------------------------------------------------------------------- the game and its rows

def _runs_recorded(monkeypatch, step_s: float) -> list[tuple]:
    """run_all's run_one replaced (nothing starts): each planned run recorded as (row, N, agent, shared) in
    the list returned, its result a step of ``step_s`` [step_s - 1, step_s + 1] on GPU "G"."""
    started: list[tuple] = []

    def fake_run_one(row, n, agent, shared, repeat, model, args, gpu=None):
        started.append((row.name, n, agent, shared))
        times = {"step_s": step_s, "step_min_s": step_s - 1, "step_max_s": step_s + 1, "gpu_name": "G"}
        return {"row": row.name, "framework": row.framework, "agents": n, "agent": agent, "shared": shared,
                "repeat": repeat, **times}  # fmt: skip

    monkeypatch.setattr(run_all, "run_one", fake_run_one)
    return started

def test_each_game_row_is_a_game_roll_ma_plays_in_its_order(relay):
    n = 3
    rows = run_atgrpo.game_rows(relay, n)
    games = run_atgrpo.games_per_step(relay, n)
    assert games == 8 and len(rows) == relay.steps * games  # one dataset row a game, every step's games
    seeds = [peer_job.game_seed(relay.seed, s, g) for s in range(1, relay.steps + 1) for g in range(games)]
    assert [r["extra_info"][atgrpo_game.GAME_KEY]["seed"] for r in rows] == seeds
    assert [r["extra_info"]["index"] for r in rows] == list(range(len(rows)))
    ours = peer_job.seat_game(relay, n)
    spec = rows[0]["extra_info"][atgrpo_game.GAME_KEY]
    assert spec == {"seed": seeds[0], "players": 3, "turns": 3, "prompt_words": 64, "relay_reply_chars": 200}
    made = atgrpo_game.make_game(spec)
    assert vars(made) == vars(
        ours
    )  # the SeatGame roll_ma's runs build (job.seat_game), argument for argument
    assert rows[0]["prompt"] == ours.reset(seeds[0]).messages  # the game's first turn


def test_a_played_game_asks_every_turn_what_seat_games_relay_asks(relay):
    """Turn t's prompt is SeatGame relay's with the t earlier replies carried; rewards are SeatGame's."""
    n = 8
    seed = peer_job.game_seed(relay.seed, 2, 1)
    spec = atgrpo_game.game_spec(peer_job.seat_game(relay, n), seed)
    seen, rows = _play(spec, copy=1)
    reference = peer_job.seat_game(relay, n)
    turn = reference.reset(seed)
    for t, row in enumerate(rows):
        assert (row.turn, row.seat, row.messages, seen[t]) == (t, turn.player, turn.messages, turn.messages)
        assert row.output == {"turn": t, "seat": turn.player}  # generate was told the acting seat
        step = reference.step(_reply(t, 1))
        assert row.reply == _reply(t, 1) and row.reward == step.rewards[turn.player] > 0
        turn = step.next_turn
    assert turn is None and len(rows) == relay.turns(n) == 8
    # the relay: the last prompt carries each earlier reply, seat by seat
    last = rows[-1].messages[1]["content"]
    assert all(f"seat {r.seat} said: {r.reply}" in last for r in rows[:-1])
    assert [r.seat for r in rows] == [(seed + t) % n for t in range(n)]


def test_group_ids_are_game_turn_and_seat():
    ids = {atgrpo_game.group_id("game-1", t, s) for t in range(3) for s in range(3)}
    assert len(ids) == 9 and all("_" not in i for i in ids)  # never read as a TransferQueue key
    assert atgrpo_game.group_id("game-1", 2, 0) == "game-1/turn2/seat0"


def test_every_copy_of_a_game_gets_the_same_groups_and_its_own_replies(relay):
    """group_size independent copies of one game (no_tree): one row per turn each, so each (game, turn, seat)
    group holds group_size rows, one per copy."""
    spec = atgrpo_game.game_spec(peer_job.seat_game(relay, 3), 1234)
    copies = [_play(spec, copy=c)[1] for c in range(relay.episodes.group_size)]
    groups: dict[str, list[float]] = {}
    for rows in copies:
        for r in rows:
            groups.setdefault(atgrpo_game.group_id("g", r.turn, r.seat), []).append(r.reward)
    assert len(groups) == relay.turns(3) and all(len(v) == relay.episodes.group_size for v in groups.values())
    assert all(len(set(v)) > 1 for v in groups.values())  # the copies' replies differ: nonzero advantages


# ---------------------------------------------------------------------------- the runner
def _settings(relay, n=3, row="atgrpo_shared"):
    return run_atgrpo.atgrpo_settings(relay, relay.rows[row], n, "/m", "/t.parquet", "/o")


def test_the_runner_takes_every_setting_from_the_job_and_its_row(relay):
    row = relay.rows["atgrpo_shared"]
    assert row.framework == "atgrpo" and row.shared
    assert row.about.startswith("PettingLLMs AT-GRPO, ported onto verl 0.9.1, single-policy (prompt) regime")
    arr = "actor_rollout_ref"
    for n, games in [(3, 8), (8, 3)]:
        s = _settings(relay, n)
        turns = relay.turns(n)
        assert s["data.train_batch_size"] == games  # one dataset row a game
        assert s[f"{arr}.rollout.n"] == relay.episodes.group_size  # its copies
        # one optimizer step on all the step's rows: games x turns x group_size = the job's rows a step
        assert s[f"{arr}.actor.ppo_mini_batch_size"] * s[f"{arr}.rollout.n"] == games * turns * 8 == 192
        assert run_atgrpo.rows_of_run(relay, n, None) == relay.episodes.rows_per_step
        assert s["trainer.experiment_name"] == f"atgrpo_shared_{n}agents"
    s = _settings(relay)
    assert (
        s["algorithm.adv_estimator"] == "grpo_vectorized" and s["algorithm.norm_adv_by_std_in_grpo"] is True
    )
    assert s["data.max_prompt_length"] == relay.prompt.max_prompt_tokens == 1024
    assert s[f"{arr}.rollout.agent.default_agent_loop"] == "atgrpo_relay"
    assert s[f"+{arr}.rollout.agent.agent_loop_manager_class"] == "atgrpo_loop.RelayAgentLoopManager"
    assert s["trainer.use_v1"] is True and s["trainer.total_training_steps"] == relay.steps
    # the rest is run_verl's mapping of the same settings (verl_best's), the row's native keys included
    verl = run_verl.verl_settings(relay, row, 3, "/m", "/t.parquet", "/o", agent=None)
    own = {k for k in s if s[k] != verl.get(k, object())}
    agent = f"{arr}.rollout.agent"
    assert own == {"data.train_batch_size", "algorithm.adv_estimator", "data.max_prompt_length",
                   f"{agent}.default_agent_loop", f"+{agent}.agent_loop_manager_class", "trainer.use_v1",
                   "trainer.experiment_name"}  # fmt: skip
    assert s[f"{arr}.model.use_remove_padding"] is True and s[f"{arr}.model.use_fused_kernels"] is True
    assert s[f"{arr}.actor.ppo_max_token_len_per_gpu"] == row.settings.update_tokens == 8192
    # the constants this runner names are atgrpo_loop's (that module imports verl, this one must not)
    source = (PEERS / "atgrpo_loop.py").read_text()
    assert f'AGENT_LOOP = "{run_atgrpo.AGENT_LOOP}"' in source and "RelayAgentLoopManager(" in source


def test_print_command_lists_the_overrides_and_starts_nothing(relay, capsys):
    argv = ["--agents", "8", "--model", "M", "--job", str(PEERS / "relay.yaml"), "--row", "atgrpo_shared"]
    assert run_atgrpo.main([*argv, "--print-command"]) == {}
    lines = capsys.readouterr().out.splitlines()
    assert "data.train_batch_size=3" in lines and "actor_rollout_ref.actor.ppo_mini_batch_size=24" in lines
    assert (
        "+actor_rollout_ref.rollout.agent.agent_loop_manager_class=atgrpo_loop.RelayAgentLoopManager" in lines
    )


def test_the_verl_process_finds_verls_wheels_the_loop_the_game_and_roll_ma(tmp_path, monkeypatch):
    (tmp_path / "verl" / "site-packages").mkdir(parents=True)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    driver = run_all.runner_env(run_all.SITE.get("atgrpo", "atgrpo"), tmp_path)  # run_all: verl's staged pins
    assert driver["PYTHONPATH"].split(":")[0] == str(tmp_path / "verl" / "site-packages")
    monkeypatch.setenv("PYTHONPATH", driver["PYTHONPATH"])
    paths = run_atgrpo.runner_env()["PYTHONPATH"].split(":")  # the runner adds the loop's folders after them
    assert paths[0] == str(tmp_path / "verl" / "site-packages")
    assert paths[-3:] == [str(PEERS), str(PEERS.parent), str(PEERS.parents[1])]


def test_passes_name_the_relay_rollout_and_the_grouping(relay):
    passes = run_atgrpo.atgrpo_passes(relay, relay.rows["atgrpo_shared"]).split("; ")
    assert passes[0].startswith("rollout: each game's group_size copies played seat after seat")
    assert passes[1].startswith("old log-probs: none") and "vLLM generation" not in "; ".join(passes)
    assert passes[-1] == "advantages: verl's grpo_vectorized over uid = (game, turn, seat)"


# ---------------------------------------------------------------------------- one LoRA per seat (stage 2)
def test_the_per_agent_row_is_atgrpo_shared_torchfused_with_one_lora_per_seat(relay):
    """Row ``atgrpo``: atgrpo_shared_torchfused's settings and native keys, one adapter per agent; the runner
    adds the multi-LoRA keys (N adapters, the glue module, its agent loop, the trainer mode), nothing else."""
    row, shared_row = relay.rows["atgrpo"], relay.rows["atgrpo_shared_torchfused"]
    assert row.framework == "atgrpo" and not row.shared and row.adapters == "per_agent"
    assert row.settings == shared_row.settings and row.native == shared_row.native
    assert row.about.startswith("PettingLLMs AT-GRPO, ported onto verl 0.9.1, lora regime")
    arr = "actor_rollout_ref"
    for n in (3, 8):
        s, shared = _settings(relay, n, "atgrpo"), _settings(relay, n, "atgrpo_shared_torchfused")
        differ = {k for k in s.keys() | shared.keys() if s.get(k) != shared.get(k)}
        assert differ == {f"+{arr}.model.lora.agents", f"{arr}.model.external_lib", "trainer.v1.trainer_mode",
                          f"{arr}.rollout.agent.default_agent_loop", "trainer.experiment_name"}  # fmt: skip
        assert (
            s[f"+{arr}.model.lora.agents"] == n and s[f"{arr}.model.external_lib"] == "atgrpo_multilora_verl"
        )
        assert s[f"{arr}.rollout.agent.default_agent_loop"] == "atgrpo_relay_multilora"
        assert s["trainer.v1.trainer_mode"] == "atgrpo_multilora" and s["trainer.experiment_name"] == (
            f"atgrpo_{n}agents"
        )
        # the same rows a step, one optimizer step on them (per agent: the multi-LoRA actor splits them)
        assert s[f"{arr}.actor.ppo_mini_batch_size"] * s[f"{arr}.rollout.n"] == relay.episodes.rows_per_step
    # verl's fused log-probs on its torch backend (its triton kernel faulted; unfused it loops over tokens)
    assert s[f"{arr}.model.use_fused_kernels"] is True
    assert s[f"{arr}.model.fused_kernel_options.impl_backend"] == "torch"
    assert s[f"{arr}.model.lora_rank"] == relay.lora.rank > 0
    # the constants this runner writes are the modules' (those import verl; this one must not)
    multilora = (PEERS / "atgrpo_multilora.py").read_text()
    assert f'TRAINER_MODE = "{run_atgrpo.TRAINER_MODE}"' in multilora
    assert run_atgrpo.DRIVER_MODULE == "atgrpo_multilora" and "@register_trainer(TRAINER_MODE)" in multilora
    assert (PEERS / f"{s[f'{arr}.model.external_lib']}.py").is_file()


def test_the_per_agent_rows_command_and_check(relay, capsys):
    argv = ["--agents", "3", "--model", "M", "--job", str(PEERS / "relay.yaml"), "--row", "atgrpo"]
    assert run_atgrpo.main([*argv, "--print-command"]) == {}
    lines = capsys.readouterr().out.splitlines()
    assert (
        "+actor_rollout_ref.model.lora.agents=3" in lines
        and "trainer.v1.trainer_mode=atgrpo_multilora" in lines
    )
    assert "actor_rollout_ref.model.external_lib=atgrpo_multilora_verl" in lines
    assert [ln for ln in lines if "default_agent_loop" in ln] == [
        "actor_rollout_ref.rollout.agent.default_agent_loop=atgrpo_relay_multilora"
    ]
    with pytest.raises(SystemExit) as stop:
        run_atgrpo.main([*argv, "--check"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == "ok: rows.atgrpo at N = 3"
    passes = run_atgrpo.atgrpo_passes(relay, relay.rows["atgrpo"]).split("; ")
    assert passes[0].endswith("each on its seat's own vLLM LoRA (max_loras = N)")
    assert passes[-1].startswith("update: one optimizer step per agent, on that agent's rows")
    assert any("every agent's LoRA adapter off" in p for p in passes)  # the reference (kl_coef > 0)


def test_one_lora_per_seat_names_the_trainer_module_for_verls_driver(monkeypatch):
    """VERL_USE_EXTERNAL_MODULES: main_ppo looks the trainer mode up in its own process (the runner's child),
    so the per-agent row's environment names atgrpo_multilora, after the caller's modules, once."""
    monkeypatch.delenv("VERL_USE_EXTERNAL_MODULES", raising=False)
    assert "VERL_USE_EXTERNAL_MODULES" not in run_atgrpo.runner_env()  # the shared rows: verl as it is
    assert run_atgrpo.runner_env(shared=False)["VERL_USE_EXTERNAL_MODULES"] == "atgrpo_multilora"
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", "mine,atgrpo_multilora")
    assert run_atgrpo.runner_env(shared=False)["VERL_USE_EXTERNAL_MODULES"] == "mine,atgrpo_multilora"
    monkeypatch.setenv("VERL_USE_EXTERNAL_MODULES", "mine")
    assert run_atgrpo.runner_env(shared=False)["VERL_USE_EXTERNAL_MODULES"] == "mine,atgrpo_multilora"
    assert run_atgrpo.runner_env(shared=False)["PYTHONPATH"].split(":")[-3] == str(PEERS)


def test_run_all_plans_the_per_agent_row_as_one_run_a_n_playing_every_seat(relay, tmp_path, monkeypatch):
    runs = run_all.plan_runs(relay, [("atgrpo", None), ("roll_ma", None)], [3, 8], 1)
    assert runs == [("atgrpo", 3, None, False, 0), ("roll_ma", 3, None, False, 0),
                    ("atgrpo", 8, None, False, 0), ("roll_ma", 8, None, False, 0)]  # fmt: skip
    args = run_all.main.__globals__["argparse"].Namespace(job="relay.yaml", device="cuda", smoke=False)
    cmd = run_all.runner_command(relay.rows["atgrpo"], 3, None, False, "M", args)
    assert cmd[1:] == [str(PEERS / "run_atgrpo.py"), "--agents", "3", "--model", "M", "--row", "atgrpo",
                       "--job", "relay.yaml"]  # fmt: skip
    started = _runs_recorded(monkeypatch, step_s=20.0)
    summary = run_all.main(["--rows", "atgrpo", "--job", str(PEERS / "relay.yaml"), "--agents", "3",
                            "--model", "M", "--repeats", "1", "--out-dir", str(tmp_path)])  # fmt: skip
    assert started == [("atgrpo", 3, None, False)]  # one run, not one per agent
    (table_row,) = summary["rows"]
    assert (table_row["row"], table_row["adapters"], table_row["status"]) == ("atgrpo", "1 per agent", "ok")
    assert run_all.combine(relay.rows["atgrpo"], 3, False, [summary["runs"][-1]])["runs"] == "1/1"


def _main_error(argv, capsys) -> str:
    with pytest.raises(SystemExit):
        run_atgrpo.main(argv)
    return capsys.readouterr().err.strip().splitlines()[-1]


def _job_with(tmp_path, row_changes: dict | None = None, **top) -> str:
    import yaml

    raw = yaml.safe_load((PEERS / "relay.yaml").read_text())
    raw["inherit"] = str(PEERS / "job.yaml")
    raw["rows"]["atgrpo_shared"].update(row_changes or {})
    raw.update(top)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def test_rows_it_cannot_run_are_refused_in_one_line_naming_the_key(relay, tmp_path, capsys):
    base = ["--agents", "3", "--model", "M", "--row", "atgrpo_shared", "--print-command"]
    shared = relay.rows["atgrpo_shared"]

    def err(**kw):
        return _main_error([*base, "--job", _job_with(tmp_path, **kw)], capsys)

    # a per-agent row: the multi-LoRA keys are the runner's, and it needs LoRA adapters
    native = {**shared.native, "trainer.v1.trainer_mode": "sync"}
    assert "rows.atgrpo_shared.native sets trainer.v1.trainer_mode, which run_atgrpo.py sets" in err(
        row_changes={"adapters": "per_agent", "native": native}
    )
    assert "lora.rank=0: one LoRA per seat needs LoRA adapters" in err(
        row_changes={"adapters": "per_agent"}, lora={**dataclasses.asdict(relay.lora), "rank": 0}
    )
    assert "grpo.norm_std=false: verl calls grpo_vectorized without its norm flag" in err(
        grpo={**dataclasses.asdict(relay.grpo), "norm_std": False}
    )
    native = {**shared.native, "data.max_prompt_length": 2048}
    assert "rows.atgrpo_shared.native sets data.max_prompt_length, which run_atgrpo.py sets" in err(
        row_changes={"native": native}
    )
    assert "settings.sleep_rollout=kv_cache is roll_ma's" in err(
        row_changes={"settings": {**dataclasses.asdict(shared.settings), "sleep_rollout": "kv_cache"}}
    )
    assert "settings.update_rows=16: verl's micro-batches are token budgets" in err(
        row_changes={"settings": {**dataclasses.asdict(shared.settings), "update_rows": 16}}
    )
    # a row of another framework
    assert "row 'verl_best' is a verl row, not atgrpo's" in _main_error(
        ["--agents", "3", "--model", "M", "--job", str(PEERS / "relay.yaml"), "--row", "verl_best"], capsys
    )
    # a native key verl's config lacks (checked against verl's flattened config where it is installed)
    bad = dataclasses.replace(
        shared, native={**shared.native, "actor_rollout_ref.model.use_fused_kernelz": True}
    )
    model = {"use_fused_kernels": True, "fused_kernel_options": {"impl_backend": None}, "override_config": {}}
    config = {
        "actor_rollout_ref": {"model": model},
        "algorithm": {"rollout_correction": {"bypass_mode": False}},
    }
    run_atgrpo.check_row(relay, shared, 3, config)
    with pytest.raises(ValueError, match=r"native: actor_rollout_ref.model.use_fused_kernelz not in verl"):
        run_atgrpo.check_row(relay, bad, 3, config)


# ---------------------------------------------------------------------------- run_all
def test_run_all_plans_one_run_a_row_and_runs_it_on_the_relay_job(relay, tmp_path, monkeypatch):
    row = relay.rows["atgrpo_shared"]
    runs = run_all.plan_runs(relay, [("atgrpo_shared", None), ("roll_ma_shared", None)], [3, 8], 1)
    assert runs == [("atgrpo_shared", 3, None, True, 0), ("roll_ma_shared", 3, None, True, 0),
                    ("atgrpo_shared", 8, None, True, 0), ("roll_ma_shared", 8, None, True, 0)]  # fmt: skip
    args = run_all.main.__globals__["argparse"].Namespace(job="relay.yaml", device="cuda", smoke=False)
    cmd = run_all.runner_command(row, 8, None, True, "M", args)
    assert cmd[1] == str(PEERS / "run_atgrpo.py") and "--agent" not in cmd
    assert cmd[2:] == ["--agents", "8", "--model", "M", "--row", "atgrpo_shared", "--job", "relay.yaml"]
    # on the relay job its rows run (nothing is started here: run_one is replaced), the single-turn peers' not
    started = _runs_recorded(monkeypatch, step_s=10.0)
    summary = run_all.main(["--rows", "atgrpo_shared,trl_shared@8", "--job", str(PEERS / "relay.yaml"),
                            "--agents", "8", "--model", "M", "--repeats", "1",
                            "--out-dir", str(tmp_path)])  # fmt: skip
    assert started == [("atgrpo_shared", 8, None, True)]
    got = {r["row"]: (r["adapters"], r["status"], r["step_s"]) for r in summary["rows"]}
    assert got == {
        "atgrpo_shared": ("1 shared", "ok", 10.0),
        "trl_shared": ("1 shared", run_all.NOT_RUNNABLE, None),
    }
    assert run_all.combine(row, 8, True, [summary["runs"][-1]])["runs"] == "1/1"


def test_run_alls_check_before_any_run_asks_the_runner_in_verls_environment(tmp_path, capsys, monkeypatch):
    """run_all --check-only: the row checked by run_atgrpo.py --check, in the run's environment (verl's staged
    site folder, so the installed verl's config answers), and refused there in one line."""
    seen = []
    real_env = run_all.runner_env
    monkeypatch.setattr(
        run_all, "runner_env", lambda site, sites, gpu=None: seen.append(site) or real_env(site, sites)
    )
    relay_file = str(PEERS / "relay.yaml")
    argv = ["--check-only", "--rows", "atgrpo_shared", "--agents", "3,8", "--out-dir", str(tmp_path)]
    assert run_all.main([*argv, "--job", relay_file]) == {}
    assert seen == ["verl", "verl"]  # N = 3 and 8, each in verl's environment
    out = capsys.readouterr().out
    assert (
        "planned: atgrpo_shared_3agents_shared_r0" in out
        and "planned: atgrpo_shared_8agents_shared_r2" in out
    )
    native = {**relay_native(), "data.max_prompt_length": 2048}
    with pytest.raises(SystemExit):
        run_all.main([*argv, "--job", _job_with(tmp_path, row_changes={"native": native})])
    refused = capsys.readouterr().err
    assert (
        "refused before any run: atgrpo_shared at N = 3" in refused and "which run_atgrpo.py sets" in refused
    )


def relay_native() -> dict:
    return dict(peer_job.load_job(PEERS / "relay.yaml").rows["atgrpo_shared"].native)


# ---------------------------------------------------------------------------- on verl 0.9.1, where it imports
def _verl():
    pytest.importorskip("verl.trainer.ppo.v1.agent_loop_tq", reason="verl 0.9.1 with its dependencies")
    import atgrpo_loop

    return atgrpo_loop


def _package_dir(name: str) -> Path:
    import importlib.util

    return Path(importlib.util.find_spec(name).origin).parent


def test_the_overrides_compose_with_verls_own_config(relay):
    _verl()
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from verl.utils.config import omega_conf_to_dataclass

    overrides = run_atgrpo.atgrpo_overrides(relay, relay.rows["atgrpo_shared"], 8, "/m", "/t.parquet", "/o")
    with initialize_config_dir(
        config_dir=str(_package_dir("verl") / "trainer" / "config"), version_base=None
    ):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    rollout = omega_conf_to_dataclass(cfg.actor_rollout_ref.rollout)  # as the agent-loop worker reads it
    assert rollout.agent.agent_loop_manager_class == "atgrpo_loop.RelayAgentLoopManager"
    assert rollout.agent.default_agent_loop == "atgrpo_relay"
    assert (rollout.prompt_length, rollout.response_length, rollout.n) == (1024, 256, 8)
    plain = OmegaConf.to_container(cfg, resolve=True)
    assert plain["algorithm"]["adv_estimator"] == "grpo_vectorized" and plain["trainer"]["use_v1"] is True
    run_atgrpo.check_row(relay, relay.rows["atgrpo_shared"], 8)  # every native key is one of this verl's
    from verl.trainer.ppo import core_algos

    assert (
        core_algos.get_adv_estimator_fn("grpo_vectorized")
        is core_algos.compute_grpo_vectorized_outcome_advantage
    )


class _Server:
    """Stands in for verl's LLM server client: records each request's prompt ids and answers a made-up
    reply (the copy's), ending in EOS."""

    def __init__(self, tokenizer, copy: int):
        self.tokenizer, self.copy, self.prompts = tokenizer, copy, []

    async def generate(self, *, request_id, prompt_ids, sampling_params, priority=0, **_):
        from verl.workers.rollout.replica import TokenOutput

        self.prompts.append(list(prompt_ids))
        ids = self.tokenizer.encode(_reply(len(self.prompts) - 1, self.copy), add_special_tokens=False)
        extra = {"min_global_steps": 0, "max_global_steps": 0}
        return TokenOutput(token_ids=[*ids, self.tokenizer.eos_token_id], log_probs=None, extra_fields=extra)


def _agent_loop(atgrpo_loop, tokenizer, copy: int, prompt_length: int = 1024):
    from omegaconf import OmegaConf
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    rollout = {"prompt_length": prompt_length, "response_length": 64}
    cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": rollout}, "data": {}})
    server = _Server(tokenizer, copy)
    loop = atgrpo_loop.RelayAgentLoop(
        trainer_config=DictConfigWrap(cfg),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data),
        hf_model_type="qwen2",
    )
    return loop, server


def _run_game(atgrpo_loop, tokenizer, spec, copy, prompt_length=1024):
    async def go():  # built inside the event loop: verl's agent loop keeps the running loop
        loop, server = _agent_loop(atgrpo_loop, tokenizer, copy, prompt_length)
        sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": False}
        outputs = await loop.run(sampling, priority=0, raw_prompt=[], extra_info={atgrpo_game.GAME_KEY: spec})
        return outputs, server

    return asyncio.run(go())


def _small_relay(relay):
    return dataclasses.replace(relay, prompt=dataclasses.replace(relay.prompt, filler_words=8))


def test_the_agent_loop_sends_seat_games_relay_prompts_one_row_a_turn(relay, tiny_model_dir):
    atgrpo_loop = _verl()
    from transformers import AutoTokenizer

    from roll_ma.envs.prompts import chat_prompt_ids, encode_chat

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    job = _small_relay(relay)
    seed = peer_job.game_seed(job.seed, 1, 2)
    spec = atgrpo_game.game_spec(peer_job.seat_game(job, 3), seed)
    outputs, server = _run_game(atgrpo_loop, tokenizer, spec, copy=2)
    reference = peer_job.seat_game(job, 3)
    turn = reference.reset(seed)
    assert len(outputs) == len(server.prompts) == job.turns(3)
    turn_messages = []
    for t, out in enumerate(outputs):
        turn_messages.append(turn.messages)
        # the ids the server got are roll_ma's prompt ids of SeatGame relay's messages (chat_prompt_ids)
        assert server.prompts[t] == chat_prompt_ids(tokenizer, turn.messages) == out.prompt_ids
        reply = tokenizer.decode(out.response_ids, skip_special_tokens=True)
        assert reply == _reply(t, 2)
        step = reference.step(reply)
        assert out.reward_score == step.rewards[turn.player]
        assert (out.extra_fields[atgrpo_game.TURN_KEY], out.extra_fields[atgrpo_game.SEAT_KEY]) == (
            t,
            turn.player,
        )
        assert out.response_mask == [1] * len(out.response_ids)
        turn = step.next_turn
    assert f"said: {_reply(0, 2)}" in tokenizer.decode(server.prompts[2])  # turn 2 carries turn 0's reply

    async def verls_own_ids(messages):  # the builder the loop's ct_build_initial_tokens stands in for
        from verl.experimental.agent_loop.agent_loop import AgentLoopBase

        loop, _ = _agent_loop(atgrpo_loop, tokenizer, copy=0)
        return await AgentLoopBase.ct_build_initial_tokens(loop, messages)

    assert asyncio.run(verls_own_ids(turn_messages[2])) == server.prompts[2]  # uncut: the same ids
    # a prompt over rollout.prompt_length is cut as roll_ma cuts it (its text from the left, the system
    # message kept), not as verl's builder would (the ids from the left); one of the system alone is refused
    limit = len(server.prompts[1]) - 1  # turn 0 fits, turns 1 and 2 (with the replies) do not
    cut_outputs, cut_server = _run_game(atgrpo_loop, tokenizer, spec, copy=2, prompt_length=limit)
    assert cut_server.prompts[0] == server.prompts[0]
    for t in (1, 2):
        messages = atgrpo_game.make_game(spec)  # the same game replayed for its turn t messages
        turn = messages.reset(seed)
        for k in range(t):
            turn = messages.step(_reply(k, 2)).next_turn
        ids, cut = encode_chat(tokenizer, turn.messages, limit)
        assert cut and cut_server.prompts[t] == ids and len(ids) <= limit
        assert tokenizer.decode(ids).count("You are seat") == 1  # the system message kept
    with pytest.raises(
        ValueError, match=r"the system prompt alone takes \d+ tokens > model.max_prompt_tokens"
    ):
        _run_game(atgrpo_loop, tokenizer, spec, copy=2, prompt_length=5)


def _stored_rows(atgrpo_loop, monkeypatch, tokenizer, spec, copies, uid="game7", lora_agents=None):
    """What verl's TransferQueue holds after the worker stored ``copies`` sessions of one game: each key's
    fields, later puts over earlier ones (as kv_batch_put does). ``lora_agents``: the model config's
    ``lora.agents`` (one LoRA per seat), None for the shared policy."""
    import types

    import transfer_queue as tq

    rows: dict[str, dict] = {}
    puts: list[list[str]] = []

    async def fake_put(keys, partition_id, fields=None, tags=None, **_):
        assert partition_id == "train"
        puts.append(list(keys))
        for i, key in enumerate(keys):
            rows.setdefault(key, {}).update({name: fields[name][i] for name in fields.keys()})

    monkeypatch.setattr(tq, "async_kv_batch_put", fake_put)
    worker = object.__new__(
        atgrpo_loop.RelayAgentLoopWorker.__ray_actor_class__
    )  # its verl state, less what a Ray actor builds
    worker.reward_loop_worker_handles, worker.distillation_enabled = None, False
    worker.processor, worker.tokenizer = None, tokenizer
    worker.model_config = types.SimpleNamespace(lora={} if lora_agents is None else {"agents": lora_agents})
    for copy in range(copies):
        outputs, _ = _run_game(atgrpo_loop, tokenizer, spec, copy)
        kwargs = {"uid": uid, "session_id": copy, "raw_prompt": [], "global_steps": 1}
        asyncio.run(worker._agent_loop_postprocess(outputs, False, **kwargs))
    return rows, puts


def test_the_worker_stores_a_row_a_turn_with_its_own_group_and_reward(relay, tiny_model_dir, monkeypatch):
    atgrpo_loop = _verl()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    job = _small_relay(relay)
    spec = atgrpo_game.game_spec(peer_job.seat_game(job, 3), 99)
    rows, puts = _stored_rows(atgrpo_loop, monkeypatch, tokenizer, spec, copies=3)
    # per session: verl's put of the turn rows (keys {uid}_{session}_{turn}), then this worker's over them
    assert puts[:2] == [["game7_0_0", "game7_0_1", "game7_0_2"]] * 2 and len(puts) == 6
    assert len(rows) == 3 * 3
    for key, row in rows.items():
        copy, turn = (int(part) for part in key.split("_")[1:])
        seat = (99 + turn) % 3  # SeatGame: seat (seed + t) mod N acts at turn t
        assert row["uid"] == f"game7/turn{turn}/seat{seat}"  # verl gave every row "game7"
        step = SeatGame(players=3, turns=3).step.__func__  # the reward SeatGame gives the reply
        game = SeatGame(players=3, turns=3)
        game.reset(99)
        game.t = turn
        reward = step(game, _reply(turn, copy)).rewards[seat]
        scores = row["rm_scores"]
        assert scores[-1].item() == pytest.approx(reward) and scores[:-1].abs().sum() == 0  # the turn's own
        assert len(scores) == len(row["responses"]) and row["extra_fields"][atgrpo_game.TURN_KEY] == turn
        assert "agent_id" not in row  # one shared policy: verl's actor gets no agent column


def test_with_one_lora_per_seat_the_worker_stores_each_rows_agent(relay, tiny_model_dir, monkeypatch):
    """model.lora.agents set (the per-agent row): each turn row's ``agent_id`` is its seat, a 0-d int64
    tensor a row (verl's put stacks them into the (B,) column the multi-LoRA actor splits rows by)."""
    atgrpo_loop = _verl()
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    spec = atgrpo_game.game_spec(peer_job.seat_game(_small_relay(relay), 3), 99)
    rows, _ = _stored_rows(atgrpo_loop, monkeypatch, tokenizer, spec, copies=2, lora_agents=3)
    assert len(rows) == 2 * 3
    for key, row in rows.items():
        seat = (99 + int(key.rsplit("_", 1)[1])) % 3
        agent = row["agent_id"]
        assert agent.dtype == torch.int64 and agent.dim() == 0 and int(agent) == seat
        assert row["uid"].endswith(f"seat{seat}")
    with pytest.raises(ValueError, match="seat 2 has no adapter: model.lora.agents=2"):
        _stored_rows(atgrpo_loop, monkeypatch, tokenizer, spec, copies=1, lora_agents=2)


def test_verls_grpo_compares_one_seat_at_one_turn_across_the_copies(relay, tiny_model_dir, monkeypatch):
    """The rows as the trainer reads them (_compute_advantage: uid, response_mask, rm_scores), through verl's
    own advantage function for multi-output sessions: grpo_vectorized groups by (game, turn, seat); verl's
    grpo would keep each session's last turn only and copy its advantage onto the session's other turns."""
    atgrpo_loop = _verl()
    import numpy as np
    import torch
    from transformers import AutoTokenizer
    from verl.protocol import DataProto
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    spec = atgrpo_game.game_spec(peer_job.seat_game(_small_relay(relay), 3), 5)
    copies = 4
    rows, _ = _stored_rows(atgrpo_loop, monkeypatch, tokenizer, spec, copies)
    keys = sorted(rows)
    width = max(len(rows[k]["response_mask"]) for k in keys)

    def padded(name):
        return torch.stack([torch.nn.functional.pad(rows[k][name].float(), (0, width - len(rows[k][name])))
                            for k in keys])  # fmt: skip

    def advantages(estimator):
        data = DataProto.from_dict(
            tensors={"response_mask": padded("response_mask"), "token_level_rewards": padded("rm_scores")},
            non_tensors={"uid": np.array([rows[k]["uid"] for k in keys], dtype=object)},
        )
        out = compute_advantage_for_multi_trajectories(data, keys, estimator, num_repeat=copies)
        return {k: out.batch["advantages"][i, 0].item() for i, k in enumerate(keys)}

    adv = advantages("grpo_vectorized")
    for turn in range(3):
        group = [k for k in keys if k.endswith(f"_{turn}")]
        rewards = torch.tensor([rows[k]["rm_scores"].sum().item() for k in group])
        expected = (rewards - rewards.mean()) / (rewards.std() + 1e-6)  # GRPO: mean and std of the group
        assert len(group) == copies
        assert [adv[k] for k in group] == pytest.approx(expected.tolist(), abs=1e-5)
    last_turn_only = advantages("grpo")
    assert all(last_turn_only[f"game7_{c}_0"] == last_turn_only[f"game7_{c}_2"] for c in range(copies))


class FakeServer:
    """verl's LLM server client for the agent-loop actors (pickled to them; this module is on their path): a
    made-up reply a request, its digit share varying from call to call, ending in EOS."""

    def __init__(self, model_dir: str):
        self.model_dir, self.tokenizer, self.calls = model_dir, None, 0

    async def generate(self, request_id=None, *, prompt_ids, sampling_params, **_):
        from transformers import AutoTokenizer
        from verl.workers.rollout.replica import TokenOutput

        if self.tokenizer is None:
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.calls += 1
        text = "seat says " + "7" * (1 + self.calls % 5) + "x" * (self.calls % 3)
        lora = (sampling_params.get("extra_args") or {}).get("atgrpo_lora_int_id")  # one LoRA per seat
        text += "" if lora is None else f" lora{lora}"
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
        steps = {"min_global_steps": 1, "max_global_steps": 1}
        return TokenOutput(token_ids=ids, log_probs=[-1.0] * len(ids), extra_fields=steps)


def _rollout_through_verl(model_dir: str, out_dir: str, row_name: str = "atgrpo_shared") -> None:
    """Run in a fresh process (its own Ray): one step's rollout of verl 0.9.1's v1 trainer with only the LLM
    server made up - the manager loaded from run_atgrpo's override as verl's TaskRunner loads it, its
    agent-loop worker actors, verl's TransferQueue and sync replay buffer, then the trainer's advantages
    (PPOTrainer._compute_advantage), the batch padded as _balance_batch pads it and fetched as verl's actor
    worker fetches it (the KVBatchMeta -> TensorDict bridge of compute_log_prob / update_actor). Prints a
    JSON line of every stored row, the trainer class of the row's mode and the padding rows' agents."""
    import json
    import uuid

    import numpy as np
    import ray
    import transfer_queue as tq
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer
    from verl.trainer.ppo.padding_utils import upsample_batch_to_divisible_size
    from verl.trainer.ppo.v1 import get_trainer_cls
    from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
    from verl.utils import tensordict_utils as tu
    from verl.utils import transferqueue_utils
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn
    from verl.utils.import_utils import load_class_from_fqn

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)  # logical: TQ 3 actors, 2 workers
    tq.init()
    try:
        job = _small_relay(peer_job.load_job(PEERS / "relay.yaml"))
        path = run_atgrpo.write_train_file(job, 3, Path(out_dir) / "train.parquet")
        overrides = run_atgrpo.atgrpo_overrides(job, job.rows[row_name], 3, model_dir, str(path), out_dir)
        overrides += ["actor_rollout_ref.rollout.agent.num_workers=2", "actor_rollout_ref.rollout.n=4"]
        with initialize_config_dir(
            config_dir=str(_package_dir("verl") / "trainer" / "config"), version_base=None
        ):
            cfg = compose(config_name="ppo_trainer", overrides=overrides)
        OmegaConf.resolve(cfg)
        manager_cls = load_class_from_fqn(
            cfg.actor_rollout_ref.rollout.agent.agent_loop_manager_class, "manager"
        )
        manager = manager_cls.create(config=cfg, llm_client=FakeServer(model_dir), teacher_client=None,
                                     reward_loop_worker_handles=None)  # fmt: skip
        # one step's games, as the trainer submits them (_next_train_batch, _submit_batch_to_rollout)
        data = RLHFDataset(
            data_files=[str(path)], tokenizer=AutoTokenizer.from_pretrained(model_dir), config=cfg.data
        )
        games = cfg.data.train_batch_size
        batch_dict = collate_fn([data[i] for i in range(games)])
        batch_dict["uid"] = np.array([str(uuid.uuid4()) for _ in range(games)], dtype=object)
        batch = tu.get_tensordict(batch_dict)
        tu.assign_non_tensor_data(batch, "global_steps", 1)
        tags = [{"is_prompt": True, "status": "pending", "global_steps": 1} for _ in range(games)]
        tq.kv_batch_put(keys=list(batch["uid"]), partition_id="train", tags=tags)
        manager.generate_sequences(batch)
        empty = OmegaConf.create({})
        buffer = ReplayBuffer(
            trainer_mode="sync",
            trainer_config=empty,
            max_off_policy_threshold=None,
            max_off_policy_strategy="drop",
            sampler_kwargs=empty,
            poll_interval=0.5,
        )
        sampled, _ = buffer.sample(global_steps=1, partition_id="train", batch_size=games)
        trainer = object.__new__(PPOTrainerSync)  # only its config is read by _compute_advantage
        trainer.config = cfg
        trainer._compute_advantage(sampled, {})
        names = ["uid", "rm_scores", "advantages", "prompts", "responses", "extra_info"]
        got = tq.kv_batch_get(keys=sampled.keys, partition_id="train", select_fields=names)
        # the actor's batch: padded as _balance_batch pads (96 rows to a multiple of 7: 2 synthetic rows),
        # then every field of every key, as the worker's tq bridge fetches it (compute_log_prob, update_actor)
        padded = upsample_batch_to_divisible_size(sampled, 7, data.tokenizer.eos_token_id)
        transferqueue_utils.TQ_INITIALIZED = True  # this process's client: tq.init() above
        actor_batch = transferqueue_utils._meta_to_realdata(padded)
        agents = (
            actor_batch["agent_id"].tolist() if "agent_id" in actor_batch.keys() else [None] * len(padded)
        )
        columns = zip(*(list(got[n]) for n in names), agents)
        rows = {
            key: {"uid": u, "reward": float(r.sum()), "advantage": float(a[0]), "prompt": p.tolist(),
                  "response": resp.tolist(), "game": e[atgrpo_game.GAME_KEY], "agent": agent}
            for key, (u, r, a, p, resp, e, agent) in zip(sampled.keys, columns)
        }  # fmt: skip
        trainer_name = get_trainer_cls(cfg.trainer.v1.trainer_mode).__name__  # main_ppo's look-up (l. 141)
        result = {
            "games": games,
            "rows": rows,
            "trainer": trainer_name,
            "padding_agents": agents[len(sampled) :],
        }
        print("ROWS " + json.dumps(result))
    finally:
        tq.close()
        ray.shutdown()


@pytest.mark.slow
@pytest.mark.parametrize("row_name", ["atgrpo_shared", "atgrpo"])
def test_one_step_of_verls_trainer_rolls_out_the_relay_and_groups_each_turn(
    relay, tiny_model_dir, tmp_path, row_name
):
    """verl 0.9.1's own rollout path with the port plugged in (only the LLM server made up; ~60 s, Ray):
    every game's copies are stored one row a turn, each prompt SeatGame relay's with the copy's earlier
    replies, each row's uid (game, turn, seat) and reward its turn's own, and verl's GRPO compares the copies
    of a turn. With one LoRA per seat (row ``atgrpo``, in the runner's environment: its PYTHONPATH and
    VERL_USE_EXTERNAL_MODULES), verl's driver finds the multi-LoRA trainer mode, each turn's request names its
    seat's LoRA, and the batch verl's actor worker fetches (all fields, synthetic padding rows included)
    carries each row's agent = seat."""
    _verl()
    import json
    import os
    import subprocess

    from transformers import AutoTokenizer

    from roll_ma.envs.prompts import chat_prompt_ids

    code = (
        "import test_atgrpo_peer as t; "
        f"t._rollout_through_verl({str(tiny_model_dir)!r}, {str(tmp_path)!r}, {row_name!r})"
    )
    per_agent = row_name == "atgrpo"
    # the runner's: PYTHONPATH, VERL_USE_EXTERNAL_MODULES (the multi-LoRA driver, the rows' varlen attention)
    env = run_atgrpo.row_env(relay.rows[row_name])
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env["PYTHONPATH"]])
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=400)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("ROWS ")]
    assert lines, out.stderr[-3000:]
    result = json.loads(lines[-1][len("ROWS ") :])
    rows, copies, turns = result["rows"], 4, 3
    assert len(rows) == result["games"] * copies * turns == 8 * 4 * 3
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    sessions: dict[str, list] = {}
    for key, row in rows.items():
        sessions.setdefault(key.rsplit("_", 1)[0], []).append((int(key.rsplit("_", 1)[1]), row))
    assert len(sessions) == result["games"] * copies
    for session, turn_rows in sessions.items():
        turn_rows.sort(key=lambda item: item[0])
        game = atgrpo_game.make_game(turn_rows[0][1]["game"])
        turn = game.reset(turn_rows[0][1]["game"]["seed"])
        for t, row in turn_rows:
            reply = tokenizer.decode(row["response"], skip_special_tokens=True)
            assert row["prompt"] == chat_prompt_ids(
                tokenizer, turn.messages
            )  # SeatGame relay's, as roll_ma's
            assert row["uid"] == f"{session.split('_')[0]}/turn{t}/seat{turn.player}"
            lora = f"lora{1000 + turn.player}"  # the server's reply names the LoRA the request asked for
            assert (lora in reply, row["agent"]) == ((True, turn.player) if per_agent else (False, None))
            step = game.step(reply)
            assert row["reward"] == pytest.approx(step.rewards[turn.player])
            turn = step.next_turn
        assert turn is None
    groups: dict[str, list] = {}
    for row in rows.values():
        groups.setdefault(row["uid"], []).append(row)
    assert len(groups) == result["games"] * turns and all(len(g) == copies for g in groups.values())
    assert result["trainer"] == ("MultiLoraPPOTrainer" if per_agent else "PPOTrainerSync")
    first = next(iter(rows.values()))  # verl's padding rows copy the batch's first row's fields
    assert result["padding_agents"] == [first["agent"]] * 2 and (first["agent"] is not None) == per_agent
    for group in groups.values():
        rewards = [r["reward"] for r in group]
        mean = sum(rewards) / copies
        std = (sum((x - mean) ** 2 for x in rewards) / (copies - 1)) ** 0.5
        want = [(x - mean) / (std + 1e-6) if std > 0 else 0.0 for x in rewards]
        assert [r["advantage"] for r in group] == pytest.approx(want, abs=1e-4)


def test_verl_reads_the_games_parquet_and_hands_each_copy_its_game(relay, tiny_model_dir, tmp_path):
    """verl's dataset, collate and TransferQueue batch (trainer_base.py _fetch_one_gen_batch) keep a row's
    game, and the prompt dict the v1 worker builds for the agent loop (agent_loop_tq.py generate_sequences)
    has it."""
    _verl()
    import numpy as np
    from hydra import compose, initialize_config_dir
    from tensordict import NonTensorData, NonTensorStack
    from transformers import AutoTokenizer
    from verl.utils import tensordict_utils as tu
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    path = run_atgrpo.write_train_file(relay, 8, tmp_path / "train.parquet")
    overrides = run_atgrpo.atgrpo_overrides(
        relay, relay.rows["atgrpo_shared"], 8, tiny_model_dir, str(path), "/o"
    )
    with initialize_config_dir(
        config_dir=str(_package_dir("verl") / "trainer" / "config"), version_base=None
    ):
        cfg = compose(config_name="ppo_trainer", overrides=overrides)
    data = RLHFDataset(
        data_files=[str(path)], tokenizer=AutoTokenizer.from_pretrained(tiny_model_dir), config=cfg.data
    )
    games = run_atgrpo.game_rows(relay, 8)
    assert len(data) == len(games) == relay.steps * 3  # none filtered as too long
    batch_dict = collate_fn([data[i] for i in range(3)])  # one step's games, as the dataloader gives them
    batch_dict["uid"] = np.array(["a", "b", "c"], dtype=object)
    batch = tu.get_tensordict(batch_dict)
    for i in range(3):
        prompt = {}
        for k, v in batch.items():  # as AgentLoopWorkerTQ.generate_sequences builds a copy's kwargs
            prompt[k] = (
                v[i].data
                if isinstance(v, NonTensorStack)
                else v.data
                if isinstance(v, NonTensorData)
                else v[i]
            )
        assert prompt["extra_info"][atgrpo_game.GAME_KEY] == games[i]["extra_info"][atgrpo_game.GAME_KEY]
        assert list(prompt["raw_prompt"]) == games[i]["prompt"]
