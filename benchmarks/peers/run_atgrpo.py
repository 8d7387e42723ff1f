"""PettingLLMs' AT-GRPO, ported onto verl 0.9.1, on the side-by-side job: ``python -m verl.trainer.main_ppo``
with run_verl.py's overrides for the row and the relay agent loop of atgrpo_loop.py (a custom agent-loop
manager, verl's ``agent_loop_manager_class`` hook).

One run plays every seat of every game (as roll_ma's runs do). A row with ``adapters: shared`` is the
single-policy (``prompt``) regime: ONE LoRA adapter for all seats, the seat named in each prompt, no verl
patch of its own (a fused row's untied-head wrapping, verl_fused_head.py, is verl_best's too). A per-agent
row is the ``lora`` regime: one LoRA, one optimizer and one vLLM LoRA id per seat, through verl's own hooks
(atgrpo_multilora_rollout.multilora_overrides; the trainer mode of atgrpo_multilora.py, registered in verl's
driver by VERL_USE_EXTERNAL_MODULES; docs/studies/issue60_plan.md, stage 2).

Per step, verl samples the step's games (data.train_batch_size = games, one parquet row each, in roll_ma's
(step, group) seed order), runs each group_size times (rollout.n), each copy a whole game of turns(N) turns
whose prompts carry the earlier replies (SeatGame's relay, when the job has ``episodes.relay``), and trains
one optimizer step on all turns x group_size x games rows (the job's rows_per_step), grouped for GRPO by
(game, turn, seat) (a per-agent row: one optimizer step per agent, on its own rows). Step times are the one
clock of job.py: verl's per-step console line (run_verl.STEP_LINE); verl's own timers are reported beside as
``phases_s``.

    python benchmarks/peers/run_atgrpo.py --agents 3 --model /path/to/random-qwen2.5-7b \
        --job benchmarks/peers/relay.yaml --row atgrpo_shared     # or --row atgrpo: one LoRA per seat
    python benchmarks/peers/run_atgrpo.py --agents 3 --model M --job J --row R --print-command   # no run
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import run_verl  # noqa: E402
from atgrpo_game import GAME_KEY, game_spec  # noqa: E402
from atgrpo_multilora_rollout import multilora_overrides  # noqa: E402
from job import (  # noqa: E402
    Job,
    Row,
    exit_code,
    game_seed,
    gpu_identity,
    measure_and_emit,
    parse_runner_args,
    rows_of_run,
    run_logged,
    runner_parser,
    seat_game,
    step_summary_from_ends,
    versions,
)

ARR = "actor_rollout_ref"
AGENT_LOOP = "atgrpo_relay"  # atgrpo_loop.AGENT_LOOP (that module imports verl; this one must not)
MANAGER = "atgrpo_loop.RelayAgentLoopManager"  # atgrpo_loop.MANAGER
# verl's GRPO over every row's uid: verl's "grpo" under the v1 trainer keeps one row per session (the last
# turn) when an agent loop returns several (verl/trainer/ppo/v1/utils.py:148-167); atgrpo_loop.py says more
ADV_ESTIMATOR = "grpo_vectorized"
# what this runner sets beyond run_verl's settings; a row's native keys may not set these either
OWN_KEYS = (
    "data.max_prompt_length",
    f"{ARR}.rollout.agent.default_agent_loop",
    f"+{ARR}.rollout.agent.agent_loop_manager_class",
    "trainer.use_v1",
)
# one LoRA per seat (a per-agent row): verl's sync v1 trainer with the multi-LoRA actor (atgrpo_multilora.py,
# which imports verl: its constants are written here and a test compares them), registered in the driver
TRAINER_MODE = "atgrpo_multilora"  # atgrpo_multilora.TRAINER_MODE
DRIVER_MODULE = "atgrpo_multilora"  # registers TRAINER_MODE, which main_ppo looks up in its driver process
MULTILORA_KEYS = (*multilora_overrides(1), "trainer.v1.trainer_mode")


def own_keys(row: Row) -> tuple[str, ...]:
    """The keys this runner sets for ``row``, which its native keys may not set."""
    return OWN_KEYS if row.shared else (*OWN_KEYS, *MULTILORA_KEYS)


def check_row(job: Job, row: Row, n_agents: int | None = None, config: dict[str, Any] | None = None) -> None:
    """Refuse, before verl starts, what this port cannot run, naming the row's key; then run_verl's checks
    (verl's own config keys, sleep, micro-batches, attention)."""
    where = f"{job.source}: rows.{row.name}"
    if not job.grpo.norm_std:
        raise ValueError(
            f"{job.source}: grpo.norm_std=false: verl calls {ADV_ESTIMATOR} without its norm flag "
            "(verl/trainer/ppo/ray_trainer.py:251-257), so it always divides by the group's std; use "
            "norm_std: true"
        )
    own = sorted(set(row.native) & set(own_keys(row)))
    if own:
        raise ValueError(
            f"{where}.native sets {', '.join(own)}, which run_atgrpo.py sets (data.max_prompt_length: the "
            "job's prompt.max_prompt_tokens, as relay prompts grow turn by turn; trainer.use_v1: only verl's "
            "v1 trainer stores several rows per agent-loop call; the multi-LoRA keys: one LoRA per seat)"
        )
    if not row.shared and job.lora.rank <= 0:
        raise ValueError(f"{job.source}: lora.rank={job.lora.rank}: one LoRA per seat needs LoRA adapters")
    run_verl.check_row(job, row, n_agents, config)


def games_per_step(job: Job, n_agents: int) -> int:
    """Games a step (verl's data.train_batch_size: one dataset row a game)."""
    return job.groups_per_step(n_agents)


def atgrpo_settings(
    job: Job, row: Row, n_agents: int, model: str, train_file: str, out_dir: str
) -> dict[str, Any]:
    """The Hydra overrides of the run: run_verl's for the row (the same verl at the same settings), with
    the step counted in games and AT-GRPO's rollout and grouping."""
    out = run_verl.verl_settings(
        job, row, n_agents, model, train_file, out_dir, agent=None, taken_elsewhere=own_keys(row)
    )
    turns_x_games = rows_of_run(job, n_agents, None) // job.episodes.group_size
    assert turns_x_games == games_per_step(job, n_agents) * job.turns(n_agents)
    out.update({
        "data.train_batch_size": games_per_step(job, n_agents),
        # verl counts a mini-batch in dataset rows x rollout.n; a game's session returns turns(N) rows, so
        # one optimizer step on the step's rows (PettingLLMs' update_actor each step) is games x turns rows
        f"{ARR}.actor.ppo_mini_batch_size": turns_x_games,
        "data.max_prompt_length": job.prompt.max_prompt_tokens,  # a turn over it: cut as roll_ma cuts
        "algorithm.adv_estimator": ADV_ESTIMATOR,
        f"{ARR}.rollout.agent.default_agent_loop": AGENT_LOOP,
        f"+{ARR}.rollout.agent.agent_loop_manager_class": MANAGER,
        "trainer.use_v1": True,  # verl's default, written out: v0 keeps one row per agent-loop call
        "trainer.experiment_name": f"{row.name}_{n_agents}agents",
    })  # fmt: skip
    if not row.shared:  # the lora regime: N adapters, N vLLM LoRA ids, each turn on its seat's
        out.update({**multilora_overrides(n_agents), "trainer.v1.trainer_mode": TRAINER_MODE})
    return out


def atgrpo_overrides(
    job: Job, row: Row, n_agents: int, model: str, train_file: str, out_dir: str
) -> list[str]:
    """``atgrpo_settings`` as Hydra's ``key=value`` lines."""
    return [f"{k}={v}" for k, v in atgrpo_settings(job, row, n_agents, model, train_file, out_dir).items()]


def game_rows(job: Job, n_agents: int) -> list[dict[str, Any]]:
    """One verl RL row per game, every step's games in roll_ma's order (steps 1.., groups 0..): the seed
    roll_ma's planner gives it (job.game_seed) and SeatGame's arguments (atgrpo_game.game_spec); ``prompt``
    is the game's first turn (verl's dataset filters and logs it; the agent loop builds every turn itself)."""
    game = seat_game(job, n_agents)
    rows = []
    for step in range(1, job.steps + 1):
        for group in range(games_per_step(job, n_agents)):
            seed = game_seed(job.seed, step, group)
            rows.append({
                "data_source": "seat_game",
                "prompt": game.reset(seed).messages,
                "ability": "game",
                "reward_model": {"style": "rule", "ground_truth": ""},
                "extra_info": {"index": len(rows), GAME_KEY: game_spec(game, seed)},
            })  # fmt: skip
    return rows


def write_train_file(job: Job, n_agents: int, path: Path) -> Path:
    import pandas as pd

    pd.DataFrame(game_rows(job, n_agents)).to_parquet(path)
    return path


def runner_env(shared: bool = True, modules: tuple[str, ...] = ()) -> dict[str, str]:
    """The verl process's environment: run_verl's, with this folder, benchmarks/ and the repository added
    to PYTHONPATH, which verl's Ray actors inherit (and vLLM's worker processes, started by the server
    actor): the TaskRunner imports atgrpo_loop (the manager), the agent-loop workers import it and
    seat_game.py, which imports roll_ma.envs.base; with one LoRA per seat (``shared`` False) every verl
    process imports atgrpo_multilora_verl (model.external_lib) and vLLM's workers atgrpo_multilora_vllm (their
    worker extension). Added last: the caller's paths (run_all: verl's staged pins first) keep their order,
    and no module of these folders (benchmarks/common.py, say) can shadow a package verl imports. With one
    LoRA per seat, VERL_USE_EXTERNAL_MODULES names atgrpo_multilora too (main_ppo finds the trainer mode
    in its own process; every process importing verl then imports it as well, which is harmless).
    ``modules``: the row's own (run_verl.external_modules: its attention's, its fused head's)."""
    return run_verl.verl_env([*modules, *([] if shared else [DRIVER_MODULE])], with_paths=True)


def row_env(row: Row) -> dict[str, str]:
    """``runner_env`` for ``row``: its adapters' modules, its attention's and its fused head's."""
    return runner_env(row.shared, tuple(run_verl.external_modules(row)))


def atgrpo_passes(job: Job, row: Row) -> str:
    """What a step runs: the relay rollout, then verl's passes as run_verl.py lists them."""
    rollout = (
        "rollout: each game's group_size copies played seat after seat (a turn's prompt carries the earlier "
        "replies), one vLLM request a turn, each turn rewarded by SeatGame in the agent loop"
    )
    grouping = f"advantages: verl's {ADV_ESTIMATOR} over uid = (game, turn, seat)"
    if row.shared:
        return "; ".join([rollout, *run_verl.verl_pass_list(job, row)[1:], grouping])
    per_agent = [
        rollout + ", each on its seat's own vLLM LoRA (max_loras = N)",
        *(p.replace("the LoRA adapter off", "every agent's LoRA adapter off")
          for p in run_verl.verl_pass_list(job, row)[1:]),
        grouping,
        "update: one optimizer step per agent, on that agent's rows under its own LoRA, then one sync "
        "sending every agent's LoRA, each loaded under its own vLLM LoRA id",
    ]  # fmt: skip
    return "; ".join(per_agent)


def run(job: Job, row: Row, n_agents: int, model: str, work: Path) -> dict[str, Any]:
    train_file = write_train_file(job, n_agents, work / "train.parquet")
    metrics_file = work / "verl_metrics.jsonl"
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo",
           *atgrpo_overrides(job, row, n_agents, model, str(train_file), str(work))]  # fmt: skip
    env = {**row_env(row), "VERL_FILE_LOGGER_PATH": str(metrics_file)}
    _, out, step_ends = run_logged(cmd, env, "run_atgrpo", run_verl.STEP_LINE)
    out.update(step_summary_from_ends(step_ends, job.warmup_steps, started_at=0.0))  # ends: s since launch
    if metrics_file.exists():
        out.update(run_verl.read_metrics(metrics_file, job.warmup_steps))
    out["rows_per_step"] = rows_of_run(job, n_agents, None)
    if out.get("response_length_mean"):
        out["response_tokens_per_step"] = out["response_length_mean"] * out["rows_per_step"]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = runner_parser(__doc__, one_agent=False)
    p.add_argument("--print-command", action="store_true", help="print the overrides and exit")
    args, job, row = parse_runner_args(p, argv, "atgrpo", check_row)
    if args.print_command:
        print("\n".join(atgrpo_overrides(job, row, args.agents, args.model, "TRAIN.parquet", "OUT")))
        return {}
    result: dict[str, Any] = {
        "framework": "atgrpo",
        "row": row.name,
        "agents": args.agents,
        "agent": None,
        "shared": row.shared,
        "trainer": "verl v1 (sync), relay agent loop (atgrpo_loop.py)"
        + ("" if row.shared else ", one LoRA per agent (atgrpo_multilora*.py)"),
        "strategy": "fsdp2",
        "settings": f"{row.name}: {row.describe()}",
        "passes": atgrpo_passes(job, row),
        "fused_kernels": run_verl.fused_kernels(row),
        "external_modules": run_verl.external_modules(row),  # imported into verl (VERL_USE_EXTERNAL_MODULES)
        "versions": versions(
            "verl", "torch", "transformers", "peft", "vllm", "ray", "tensordict", "transferqueue"
        ),
        **gpu_identity(),
    }

    def measure() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="peers_atgrpo_") as work:
            return run(job, row, args.agents, args.model, Path(work))

    return measure_and_emit(result, measure)


if __name__ == "__main__":
    sys.exit(exit_code(main()))
