r"""Run the side-by-side job through roll_ma and each peer and write the table: one machine, one clock.

The job file (job.yaml, or relay.yaml) is the one source: the work, and the table's rows, each a
framework at named settings (``rows``); a runner takes its row's settings from there and keeps none of its
own. For every N in the job's ``agents`` and every row: roll_ma once (all N agents in one run), a peer N
times (one run per agent, on that agent's share of the same episodes); a row with ``adapters: shared`` is
one run where ONE adapter serves every seat (the prompt names the seat; a peer trained once on every seat's
prompts). A peer's row sums its runs' median step times (and min, max), response tokens and phase timers.

Repeats: every row runs ``repeats`` times (the job's, or ``--repeats``); a run's repeat goes to another GPU
than its previous repeat (GPUs swapped), the table gives the median of the repeats' medians with their
spread [min, max], and the headline (peers.md's first table) puts each roll_ma row against each peer's
fastest row at the same N: a ratio whose spreads overlap is called a tie. The plan runs every row's first
repeat before any second one, N in the job's order: a run_all cut short keeps whole repeats.

Runs go to the GPUs of ``--gpus`` at once, one run per GPU (pinned by CUDA_VISIBLE_DEVICES); each run's
GPU name, driver and host are recorded, its memory peak is read from its own GPU only (nvidia-smi -i), and
ratios are taken only between rows measured on one GPU model. Results are saved after every run
(peers.json, peers.md), so a run_all started in the background can be read while it goes on.

A job whose turns carry earlier replies (``episodes.relay``) cannot be handed to a single-turn trainer:
the peers' rows are written as not runnable, with why; roll_ma's rows run, and so do AT-GRPO's on verl
(``atgrpo``, run_atgrpo.py), whose one run plays every seat of each game as roll_ma's does.

Each framework runs in its own Python environment: ``--sites DIR`` holds one folder per peer (DIR/trl,
DIR/verl, DIR/openrlhf: its staged pins, stage_peer_wheels.sh) whose site-packages goes first on that
peer's PYTHONPATH, then DIR/common's (the wheels all staged peers share).

    # GPU (2 GPUs), the random Qwen2.5-7B built once; the rows in priority order:
    python benchmarks/peers/run_all.py --sites /tmp/peers --gpus 0,1 --rows roll_ma,trl_best,roll_ma_unfused \
        --out-dir /tmp/peers_out
    python benchmarks/peers/run_all.py --job benchmarks/peers/relay.yaml --gpus 0,1 --rows roll_ma \
        --out-dir /tmp/relay_out
    # CPU check of the driver itself: roll_ma and TRL (no vLLM) on a tiny model, the job shrunk
    python benchmarks/peers/run_all.py --device cpu --smoke --rows roll_ma,trl --agents 3 --repeats 1 \
        --out-dir /tmp/smoke_out

A row name may carry ``@N[+N]`` (``openrlhf@1``): only those N.

Before any run starts, each planned row is checked at each N by its own runner (``--check``, in that
run's environment); a refusal stops the whole call in seconds, one line a row. ``--check-only`` does that
and prints the plan, so a lease's chains can be checked on a CPU first:

    python benchmarks/peers/run_all.py --check-only --rows roll_ma_noahead,trl_mb32_awake --agents 3,8 \
        --out-dir /tmp/unused
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(HERE.parent)]

from job import FRAMEWORK_NAMES, WHOLE_GAME_FRAMEWORKS, Job, Row, is_oom, load_job, read_result  # noqa: E402

RUNNERS = {f: HERE / f"run_{f}.py" for f in FRAMEWORK_NAMES}
SITE = {"atgrpo": "verl"}  # the AT-GRPO port runs on verl's staged wheels (--sites DIR/verl), nothing new
PHASES = ("rollout", "scoring", "old_log_probs", "update", "sync")
COLUMNS = [
    "row",
    "agents",
    "adapters",
    "repeats",
    "step_s",
    "spread_s",
    "vs_roll_ma",
    "tokens_per_s",
    "first_step_end_s",
    "phases",
    "gpu",
    "gpu_peak_gb",
    "status",
]
HEADLINE_COLUMNS = [
    "agents",
    "adapters",
    "roll_ma_row",
    "roll_ma_s",
    "peer_row",
    "peer_s",
    "ratio",
    "verdict",
]
NOT_RUNNABLE = (
    "not runnable: a single-turn trainer is handed its prompts in advance, and a relay turn's prompt "
    "carries the earlier turns' replies"
)


class GpuPeak:
    """The largest ``memory.used`` nvidia-smi reports for GPU ``gpu`` while it runs (None without
    nvidia-smi or GPU): that GPU only, whatever runs on the others."""

    def __init__(self, gpu: str | None) -> None:
        self.gpu = gpu
        self.peak_mib: float | None = None
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuPeak:
        if self.gpu is not None and shutil.which("nvidia-smi"):
            cmd = ["nvidia-smi", "-i", self.gpu, "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                   "-lms", "500"]  # fmt: skip
            self._proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            self._thread = threading.Thread(target=self._read, daemon=True)
            self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            values = [float(v) for v in line.split(",") if v.strip().replace(".", "", 1).isdigit()]
            if values:
                self.peak_mib = max(self.peak_mib or 0.0, *values)

    def __exit__(self, *exc: Any) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def peak_gb(self) -> float | None:
        return round(self.peak_mib / 1024, 2) if self.peak_mib is not None else None


def runner_command(
    row: Row, n_agents: int, agent: int | None, shared: bool, model: str, args: argparse.Namespace
) -> list[str]:
    """The runner's command line of one run at ``row``'s settings: a peer's run trains ``agent``, or (a
    shared row: the runner reads that from the row) one adapter on every seat's rows; roll_ma's one run
    trains every agent."""
    framework = row.framework
    if shared != row.shared:
        raise ValueError(f"rows.{row.name}: a {'shared' if shared else 'per-agent'} run of a row with "
                         f"adapters: {row.adapters}")
    cmd = [sys.executable, str(RUNNERS[framework]), "--agents", str(n_agents), "--model", model]
    cmd += ["--row", row.name] + (["--job", args.job] if args.job else [])
    if not shared and framework not in WHOLE_GAME_FRAMEWORKS:
        cmd += ["--agent", str(agent)]
    if framework in ("roll_ma", "trl"):
        cmd += ["--device", args.device] + (["--smoke"] if args.smoke else [])
    if framework == "trl" and args.device == "cpu":
        cmd.append("--no-vllm")
    if framework == "openrlhf":
        cmd.append("--flash-attn-shim")
    return cmd


DISTRIBUTED_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CROSS_RANK",
    "CROSS_SIZE",
)


def runner_env(site: str, sites: Path | None, gpu: str | None = None) -> dict[str, str]:
    """The environment of one run: the peer's own site folder first, then the repo (job.py imports
    roll_ma's SeatGame), then what the caller had (the staged roll_ma stack); pinned to GPU ``gpu``."""
    # no rendezvous of the caller's: a process that already ran torch.distributed (a test session that
    # built DeepSpeed engines) left RANK / WORLD_SIZE behind, and each peer's launcher sets its own
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARS}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    paths = [str(REPO)]
    # DIR/<peer>/site-packages (install_peer_wheels.sh): dill, hashing a datasets.Dataset, pickles by value
    # any module outside a site-packages folder, and pyarrow by value does not pickle (MonthDayNano)
    if sites is not None and (sites / site / "site-packages").is_dir():  # its pins, then the shared
        paths[:0] = [
            str(sites / name / "site-packages")
            for name in (site, "common")
            if (sites / name / "site-packages").is_dir()
        ]
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    return env


LIVE_SESSIONS: set[int] = set()  # process groups of the runs in flight (one per GPU)


def kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_all_runs(*_: Any) -> None:
    """run_all itself stopped (an outer `timeout`, SIGTERM): take every run in flight down with it."""
    for pid in list(LIVE_SESSIONS):
        kill_session(pid)
    sys.exit(143)


def run_process(
    cmd: list[str], env: dict[str, str], timeout: int, log_path: Path | None = None
) -> tuple[str, int | None]:
    """(output, exit code; None on timeout) of ``cmd`` in its own session; afterwards every process
    left in that session (Ray workers, vLLM engine cores) is killed, so the next run gets a free GPU.

    With ``log_path`` the output goes to that file as it comes (a run cut short by the timeout, or by
    run_all itself being stopped, leaves its log up to that moment), then the file keeps its tail: engines
    log a lot, and the device returns few MB."""
    with (
        tempfile.TemporaryFile("w+", errors="replace") if log_path is None
        else open(log_path, "w+", errors="replace")
    ) as log:
        proc = subprocess.Popen(
            cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True
        )
        LIVE_SESSIONS.add(proc.pid)
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            kill_session(proc.pid)  # the session's leftovers (or, on a timeout, the whole run)
            LIVE_SESSIONS.discard(proc.pid)
            proc.wait()
        log.seek(0)
        output = log.read()
    if log_path is not None and len(output) > LOG_TAIL_CHARS:
        log_path.write_text(output[-LOG_TAIL_CHARS:])
    return output, code


LOG_TAIL_CHARS = 200_000


# One planned run: (row name, N, agent or None, shared, repeat)
Run = tuple[str, int, "int | None", bool, int]


def run_tag(row: str, n_agents: int, agent: int | None, shared: bool, repeat: int) -> str:
    who = "_shared" if shared else (f"_agent{agent}" if agent is not None else "")
    return f"{row}_{n_agents}agents{who}_r{repeat}"


def run_one(
    row: Row,
    n_agents: int,
    agent: int | None,
    shared: bool,
    repeat: int,
    model: str,
    args: argparse.Namespace,
    gpu: str | None = None,
) -> dict[str, Any]:
    """One runner process on GPU ``gpu``: its result line, its log file, the GPU peak seen while it ran."""
    cmd = runner_command(row, n_agents, agent, shared, model, args)
    tag = run_tag(row.name, n_agents, agent, shared, repeat)
    log_path = Path(args.out_dir) / f"{tag}.log"
    print(f"[run_all] {tag} on GPU {gpu}: {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    with GpuPeak(gpu) as peak:
        env = runner_env(SITE.get(row.framework, row.framework), args.sites, gpu)
        output, code = run_process(cmd, env, args.timeout, log_path)
    result = read_result(output) or {
        "error": f"no result line (exit code {code}; timeout {args.timeout} s)"
        if code is None
        else f"no result line (exit code {code})",
        "oom": is_oom(output),
    }
    # the run's identity as this driver planned it (a runner's own fields cannot mislabel a row)
    result.update(row=row.name, framework=row.framework, agents=n_agents, agent=agent, shared=shared)
    # the settings beside the run: the row's; a CPU smoke run says what it left out (its runner's own words)
    ran = f"{result.get('settings') or 'CPU smoke'} (of: {row.describe()})" if args.smoke else row.describe()
    result.update(repeat=repeat, host=socket.gethostname(), settings=f"{row.name}: {ran}")
    result.update(gpu_peak_gb=peak.peak_gb, wall_s=round(time.perf_counter() - start, 1), log=str(log_path))
    if gpu is not None:
        result.setdefault("gpu_index", gpu)
    print(f"[run_all] {tag}: step_s={result.get('step_s')} error={result.get('error')}", flush=True)
    return result


def check_runs(
    job: Job, runs: list[Run], model: str, args: argparse.Namespace, workers: int = 4
) -> list[str]:
    """Each planned (row, N, layout) checked by its own runner (``--check``, in the run's environment: the
    peer's site folder, so its installed version answers) before any run starts; the refusals, one line
    each. A row that cannot run at an N (TRL's update_rows not dividing a run's rows, an unknown native
    key) is then refused in seconds, not after the runs before it took the GPU for minutes."""
    first: dict[tuple[str, int, bool], Run] = {}
    for run in runs:
        first.setdefault((run[0], run[1], run[3]), run)

    def check(run: Run) -> str | None:
        name, n, agent, shared, _ = run
        row = job.rows[name]
        cmd = runner_command(row, n, agent, shared, model, args) + ["--check"]
        site = SITE.get(row.framework, row.framework)
        output, code = run_process(cmd, runner_env(site, args.sites), timeout=600)
        if code == 0:
            return None
        lines = [line for line in output.splitlines() if line.strip()]
        said = next((line for line in reversed(lines) if ": error: " in line), lines[-1] if lines else "")
        why = said.split(": error: ", 1)[-1] if said else f"exit code {code}, no output"
        return f"{name} at N = {n}: {why}"

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return [why for why in pool.map(check, first.values()) if why]


class StartStagger:
    """Spaces the runs' starts at least ``seconds`` apart, across all GPU threads."""

    def __init__(self, seconds: float, clock: Any = time.monotonic, sleep: Any = time.sleep) -> None:
        self.seconds, self.clock, self.sleep = seconds, clock, sleep
        self._lock = threading.Lock()
        self._last: float | None = None

    def wait_turn(self) -> None:
        with self._lock:  # one thread at a time: each waits for the start before it
            now = self.clock()
            if self._last is not None and now - self._last < self.seconds:
                self.sleep(self.seconds - (now - self._last))
            self._last = self.clock()


def _sum(values: list[Any]) -> float | None:
    return round(sum(values), 3) if values and all(v is not None for v in values) else None


def combine(row: Row, n_agents: int, shared: bool, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One repeat of one table row. roll_ma, or any shared-adapter run: its one run. A peer: its N
    per-agent runs summed (median, min and max step time, response tokens, each phase), the largest GPU
    peak, the first error; a repeat missing any of its runs has no step time."""
    expected = 1 if (row.framework in WHOLE_GAME_FRAMEWORKS or shared) else n_agents
    errors = [r["error"] for r in runs if r.get("error")]
    complete = len(runs) == expected and all(r.get("step_s") is not None for r in runs)
    step_s = _sum([r.get("step_s") for r in runs]) if complete else None
    tokens = _sum([r.get("response_tokens_per_step") for r in runs])
    phases = {}
    for name in sorted({k for r in runs for k, v in (r.get("phases_s") or {}).items() if v is not None}):
        phases[name] = _sum([(r.get("phases_s") or {}).get(name) for r in runs])
    names = sorted({r.get("gpu_name") or "?" for r in runs})
    peaks = [r["gpu_peak_gb"] for r in runs if r.get("gpu_peak_gb") is not None]
    firsts = [r["first_step_end_s"] for r in runs if r.get("first_step_end_s") is not None]
    status = errors[0] if errors else ("ok" if complete else f"incomplete: {len(runs)} of {expected} runs")
    return {
        "step_s": step_s,
        "step_min_s": _sum([r.get("step_min_s") for r in runs]) if complete else None,
        "step_max_s": _sum([r.get("step_max_s") for r in runs]) if complete else None,
        "tokens_per_s": round(tokens / step_s, 1) if step_s and tokens else None,
        # start-up + step 1 of the slowest of the repeat's runs (runs on several GPUs start together)
        "first_step_end_s": max(firsts) if firsts else None,
        "phases_s": phases or None,
        "gpus": names,
        "gpu_indexes": sorted({str(r.get("gpu_index")) for r in runs}),
        "gpu_peak_gb": max(peaks) if peaks else None,
        "oom": any(r.get("oom") for r in runs),
        "status": status,
        "runs": f"{len(runs)}/{expected}",
    }


def row_identity(row: Row, n_agents: int, shared: bool) -> dict[str, Any]:
    """What names a table row: the job's row, its framework, N and the adapter layout."""
    adapters = "1 shared" if shared else ("1" if n_agents == 1 else "1 per agent")
    return {"row": row.name, "framework": row.framework, "agents": n_agents, "adapters": adapters,
            "shared": shared}  # fmt: skip


def table_row(
    row: Row, n_agents: int, shared: bool, repeats: list[dict[str, Any]], planned: int
) -> dict[str, Any]:
    """One row of the table from its repeats (each a ``combine``): the median of the repeats' median step
    times, their spread, the median repeat's phases; the GPUs every repeat ran on."""
    done = [r for r in repeats if r["step_s"] is not None]
    names = sorted({g for r in repeats for g in r["gpus"]})
    mid = sorted(done, key=lambda r: r["step_s"])[len(done) // 2] if done else None
    errors = [r["status"] for r in repeats if r["status"] != "ok"]
    return {
        **row_identity(row, n_agents, shared),
        "repeats": f"{len(done)}/{planned}",
        "step_s": round(statistics.median(r["step_s"] for r in done), 3) if done else None,
        "spread_s": [min(r["step_s"] for r in done), max(r["step_s"] for r in done)] if done else None,
        "repeat_step_s": [r["step_s"] for r in repeats],
        "repeat_gpus": [",".join(r["gpu_indexes"]) for r in repeats],
        "tokens_per_s": mid["tokens_per_s"] if mid else None,
        "first_step_end_s": mid["first_step_end_s"] if mid else None,
        "phases_s": mid["phases_s"] if mid else None,
        "phases": ", ".join(f"{k} {v:.2f}" for k, v in (mid["phases_s"] or {}).items() if v is not None)
        if mid
        else None,
        "gpu": names[0] if len(names) == 1 else "mixed: " + ", ".join(names),
        "gpu_peak_gb": max((r["gpu_peak_gb"] for r in repeats if r["gpu_peak_gb"] is not None), default=None),
        "oom": any(r["oom"] for r in repeats),
        "status": "ok" if not errors else errors[0],
        "settings": f"{row.describe()}",
        "about": row.about,
    }


def run_key(r: dict[str, Any]) -> tuple[str, int, int | None, bool, int]:
    return r["row"], r["agents"], r.get("agent"), bool(r.get("shared")), int(r.get("repeat", 0))


def table_rows(job: Job, runs: list[dict[str, Any]], planned_repeats: int) -> list[dict[str, Any]]:
    """The table: one row per (N, per-agent or shared, job row) that has runs, N first, job order within."""
    order = list(job.rows)
    keys = sorted({(r["agents"], bool(r.get("shared")), r["row"]) for r in runs},
                  key=lambda k: (k[0], k[1], order.index(k[2]) if k[2] in order else len(order)))  # fmt: skip
    rows = []
    for n, shared, name in keys:
        mine = [r for r in runs if (r["agents"], bool(r.get("shared")), r["row"]) == (n, shared, name)]
        if name not in job.rows:
            continue
        if mine and all(r.get("not_runnable") for r in mine):
            rows.append(not_runnable_row(job.rows[name], n, shared))
            continue
        repeats = sorted({int(r.get("repeat", 0)) for r in mine})
        combined = [combine(job.rows[name], n, shared, [r for r in mine if int(r.get("repeat", 0)) == k])
                    for k in repeats]  # fmt: skip
        rows.append(table_row(job.rows[name], n, shared, combined, max(planned_repeats, len(repeats))))
    add_ratios(rows)
    return rows


def not_runnable_row(row: Row, n_agents: int, shared: bool) -> dict[str, Any]:
    return {
        **row_identity(row, n_agents, shared),
        "repeats": "0/0",
        "step_s": None,
        "spread_s": None,
        "gpu": "-",
        "status": NOT_RUNNABLE,
        "settings": row.describe(),
        "about": row.about,
    }


def merge_runs(previous: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``previous`` runs (of earlier calls with the same --out-dir) with those of this call added; a run
    of the same (row, N, agent, shared, repeat) is replaced."""
    fresh = {run_key(r) for r in new}
    return [r for r in previous if run_key(r) not in fresh] + list(new)


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """vs_roll_ma = the row's step time / roll_ma's defaults row's at the same N and adapter layout (> 1:
    roll_ma is faster), only where both rows ran on one GPU model (a row of mixed GPUs gets none)."""
    ours = {(r["agents"], r["shared"]): r for r in rows if r["row"] == "roll_ma" and r["step_s"]}
    for r in rows:
        base = ours.get((r["agents"], r["shared"]))
        same_gpu = base is not None and base["gpu"] == r["gpu"] and not r["gpu"].startswith("mixed")
        r["vs_roll_ma"] = round(r["step_s"] / base["step_s"], 2) if same_gpu and r["step_s"] else None


def headline(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each roll_ma row against each peer's fastest row at the same N and adapter layout, on one GPU
    model: ratio = peer / roll_ma (> 1: roll_ma is faster); a tie where the two spreads overlap."""
    out = []
    for r in rows:
        if r["framework"] != "roll_ma" or not r["step_s"]:
            continue
        same = (r["agents"], r["shared"], r["gpu"])
        peers = [
            p for p in rows
            if p["framework"] != "roll_ma" and p["step_s"] and (p["agents"], p["shared"], p["gpu"]) == same
        ]  # fmt: skip
        for framework in sorted({p["framework"] for p in peers}):
            best = min((p for p in peers if p["framework"] == framework), key=lambda p: p["step_s"])
            lo, hi = r["spread_s"]
            plo, phi = best["spread_s"]
            ratio = round(best["step_s"] / r["step_s"], 2)
            overlap = lo <= phi and plo <= hi
            verdict = (
                "tie (spreads overlap)"
                if overlap
                else ("roll_ma faster" if ratio > 1 else f"{framework} faster")
            )
            out.append({
                "agents": r["agents"], "adapters": r["adapters"], "roll_ma_row": r["row"],
                "roll_ma_s": r["step_s"], "peer_row": best["row"], "peer_s": best["step_s"], "ratio": ratio,
                "verdict": verdict,
            })  # fmt: skip
    return out


# Minutes one run took on an H100 with 2026-11-27's job (start-up + 7 steps; verl starts in ~6.5 min):
# (framework, whole step in one run) -> minutes. The plan balances the GPUs by them.
RUN_MINUTES = {
    ("verl", True): 13.0,
    ("verl", False): 9.0,
    ("atgrpo", True): 13.0,  # not measured yet: verl's start-up and a whole step's rows, as verl's shared run
    ("roll_ma", True): 6.2,
    ("openrlhf", True): 3.9,
    ("trl", True): 3.5,
    ("trl", False): 2.1,
}


def plan_runs(
    job: Job, rows: list[tuple[str, set[int] | None]], agents: list[int], repeats: int
) -> list[Run]:
    """Every run of the table, as (row, N, agent, shared, repeat), in the order they should start: N in
    the given order, then repeat, then the rows in the given order (a run_all cut short keeps whole
    repeats of the first N). A peer's row is N runs (one per agent); roll_ma's is one, and so is any row
    with ``adapters: shared`` (one adapter, every seat's rows)."""
    runs: list[Run] = []
    for n in agents:
        for repeat in range(repeats):
            for name, only in rows:
                if only is not None and n not in only:
                    continue
                row = job.rows[name]
                if row.shared:
                    runs.append((name, n, None, True, repeat))
                elif row.framework in WHOLE_GAME_FRAMEWORKS:
                    runs.append((name, n, None, False, repeat))
                else:
                    runs += [(name, n, a, False, repeat) for a in range(n)]
    return runs


def assign_gpus(job: Job, runs: list[Run], gpus: list[Any]) -> dict[Any, list[Run]]:
    """Each GPU's queue: a run goes to the GPU with the fewest planned minutes so far, but never to the
    GPU its previous repeat was given (GPUs swapped between repeats, where there are several)."""
    queues: dict[Any, list[Run]] = {g: [] for g in gpus}
    minutes = {g: 0.0 for g in gpus}
    last: dict[tuple, Any] = {}
    for run in runs:
        name, n, agent, shared, _ = run
        framework = job.rows[name].framework
        whole = framework in WHOLE_GAME_FRAMEWORKS or agent is None or n == 1
        cost = RUN_MINUTES.get((framework, whole), 5.0)
        key = (name, n, agent, shared)
        free = [g for g in gpus if g != last.get(key)] if len(gpus) > 1 and key in last else gpus
        gpu = min(free, key=lambda g: (minutes[g], gpus.index(g)))
        queues[gpu].append(run)
        minutes[gpu] += cost
        last[key] = gpu
    return queues


def parse_rows(job: Job, text: str | None) -> list[tuple[str, set[int] | None]]:
    """``roll_ma,trl_best,openrlhf@1`` -> [(row, only these N or None)]; unknown rows are refused.
    None: every row of the job."""
    if not text:
        return [(name, None) for name in job.rows]
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, only = item.partition("@")
        if name not in job.rows:
            raise ValueError(f"--rows {name!r}: the job's rows are {', '.join(job.rows)}")
        out.append((name, {int(n) for n in only.split("+")} if only else None))
    return out


def build_model(job: Job, device: str, out_dir: Path) -> str:
    """The random-weight model every framework loads: the job's architecture on GPU, tiny on CPU."""
    if device == "cpu":
        from roll_ma.models.tiny import build_tiny_model

        return build_tiny_model(out_dir / "tiny_model", seed=job.seed)
    cmd = [
        sys.executable,
        "-m",
        "roll_ma.models.random_weights",
        job.model,
        "--dtype",
        job.dtype,
        "--seed",
        str(job.seed),
    ]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, env=runner_env("roll_ma", None))
    return out.stdout.strip().splitlines()[-1]


def write_tables(out_dir: Path, summary: dict[str, Any]) -> None:
    """peers.md: the headline (each roll_ma row against each peer's fastest), the table, each row's
    settings."""
    from common import markdown_table

    rows = summary["rows"]
    shown = [{**r, "spread_s": "[{:.2f}, {:.2f}]".format(*r["spread_s"]) if r.get("spread_s") else None}
             for r in rows]  # fmt: skip
    parts = [
        f"job: {summary['job']}; {summary['date']}",
        markdown_table(HEADLINE_COLUMNS, summary["headline"]) if summary["headline"] else "(no headline yet)",
        markdown_table(COLUMNS, shown),
        "\n".join(
            f"- **{r['row']}** ({r['about']}): {r['settings']}" for r in {r["row"]: r for r in rows}.values()
        ),  # fmt: skip
    ]
    (out_dir / "peers.md").write_text("\n\n".join(parts) + "\n")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default=None, help="comma list of the job's rows, in priority order; a name "
                   "may end in @N[+N] (only those N); default: every row of the job")  # fmt: skip
    p.add_argument("--agents", default=None, help="comma list of N (default: the job's agents)")
    p.add_argument("--repeats", type=int, default=None, help="runs of every row (default: the job's repeats)")
    p.add_argument("--model", default=None, help="model directory (default: built from the job)")
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    p.add_argument("--gpus", default="0", help="GPUs to run on at once, one run each (e.g. 0,1,2,3)")
    p.add_argument("--job", default=None, help="job file (default: job.yaml beside this script)")
    p.add_argument("--smoke", action="store_true", help="roll_ma and TRL on the job shrunk to CPU size")
    p.add_argument(
        "--sites", type=Path, default=None, help="folder of per-peer site folders (stage_peer_wheels)"
    )
    p.add_argument("--timeout", type=int, default=3600, help="seconds per runner process")
    p.add_argument(
        "--check-only",
        action="store_true",
        help="check every planned run's row with its runner (as before any run), print the plan, start "
        "nothing: a chain's rows checked on a CPU before a GPU lease",
    )
    p.add_argument(
        "--stagger-s",
        type=float,
        default=None,
        help="seconds between two runs' starts (default: 45 with several GPUs, else 0): every runner starts "
        "its own local Ray instance, and two started at once can hang for good (2026-11-27: 2 of 4 verl "
        "runs started together printed nothing in 900 s; Ray calls several local instances unsupported)",
    )
    p.add_argument(
        "--out-dir",
        required=True,
        help="results (peers.json, peers.md) and every run's log; runs of earlier calls there are kept",
    )
    args = p.parse_args(argv)
    try:
        job = load_job(args.job) if args.job else load_job()
        rows = parse_rows(job, args.rows)
    except ValueError as exc:  # a bad row; a job file missing, unreadable, not YAML or not a job
        p.error(str(exc))
    agents = [int(n) for n in args.agents.split(",")] if args.agents else list(job.agents)
    for name, only in rows:  # a row limited to N that this call does not run would silently run nothing
        if only and not only & set(agents):
            p.error(f"--rows {name}@{'+'.join(map(str, sorted(only)))}: N is not among the agents this call "
                    f"runs ({', '.join(map(str, agents))}; --agents)")
    repeats = args.repeats or job.repeats
    peer_rows: list[tuple[str, set[int] | None]] = []
    if job.episodes.relay:  # the single-turn peers' rows of a relay job: written as not runnable, not run
        whole = {name for name, _ in rows if job.rows[name].framework in WHOLE_GAME_FRAMEWORKS}
        peer_rows = [(name, only) for name, only in rows if name not in whole]
        rows = [(name, only) for name, only in rows if name in whole]
    planned = plan_runs(job, rows, agents, repeats)
    refused = check_runs(job, planned, args.model or "-", args)  # the model is built after, and not read
    for why in refused:
        print(f"[run_all] refused before any run: {why}", file=sys.stderr, flush=True)
    if refused:
        raise SystemExit(2)
    if args.check_only:
        for run in planned:
            print(f"[run_all] planned: {run_tag(*run)}", flush=True)
        return {}
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    saved = out_dir / "peers.json"
    lock = threading.Lock()
    summary: dict[str, Any] = {}

    def record(results: list[dict[str, Any]]) -> None:
        """Merge finished runs into peers.json / peers.md (the table so far)."""
        previous = json.loads(saved.read_text()).get("runs", []) if saved.exists() else []
        runs = merge_runs(previous, results)
        table = table_rows(job, runs, repeats)
        if args.smoke:  # a smoke row's settings: what its runs say they ran on this CPU
            said = {r["row"]: r["settings"].removeprefix(f"{r['row']}: ") for r in runs if r.get("settings")}
            for r in table:
                r["settings"] = said.get(r["row"], r["settings"])
        stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        summary.update(date=stamp, job=job.source, model=model, device=args.device, repeats=repeats,
                       headline=headline(table), rows=table, runs=runs)  # fmt: skip
        saved.write_text(json.dumps(summary, indent=1))
        write_tables(out_dir, summary)

    if peer_rows:
        model = args.model or "-"
        record([{"row": name, "framework": job.rows[name].framework, "agents": n, "agent": None,
                 "shared": job.rows[name].shared, "repeat": 0, "not_runnable": True}
                for name, only in peer_rows for n in agents if only is None or n in only])  # fmt: skip
    model = args.model or build_model(job, args.device, out_dir)
    gpus: list[str | None] = [g.strip() for g in args.gpus.split(",")] if args.device == "cuda" else [None]
    queues = assign_gpus(job, planned, gpus)
    stagger = StartStagger(args.stagger_s if args.stagger_s is not None else (45.0 if len(gpus) > 1 else 0.0))

    def worker(gpu: str | None) -> None:
        for name, n, agent, shared, repeat in queues[gpu]:
            stagger.wait_turn()
            result = run_one(job.rows[name], n, agent, shared, repeat, model, args, gpu)
            with lock:
                record([result])

    previous = signal.signal(signal.SIGTERM, stop_all_runs)
    threads = [threading.Thread(target=worker, args=(g,)) for g in gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    signal.signal(signal.SIGTERM, previous)
    if summary:
        print((out_dir / "peers.md").read_text(), flush=True)
    return summary


if __name__ == "__main__":
    main()
