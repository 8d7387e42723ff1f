"""Run the side-by-side job through roll_ma and each peer and write the table: one machine, one clock.

For every N in the job's ``agents``: roll_ma once (all N agents in one run), each peer N times (one run
per agent, on that agent's share of the same episodes); with ``--shared`` (N > 1) also one run per
framework where ONE adapter serves every seat (the prompt names the seat): roll_ma with all agents on
one adapter, a peer trained once on every seat's prompts, which is how most peer users train a team. A
peer's row sums its runs' median step times (and min, max), response tokens and phase timers.

Runs go to the GPUs of ``--gpus`` at once, one run per GPU (pinned by CUDA_VISIBLE_DEVICES), longest
first; each run's GPU name, driver and host are recorded, its memory peak is read from its own GPU only
(nvidia-smi -i), and vs_roll_ma is computed only between rows measured on the same GPU model. Results are
saved after every run (peers.json, peers.md), so a run_all started in the background can be read while
it goes on.

Each framework runs in its own Python environment: ``--sites DIR`` holds one folder per peer (DIR/trl,
DIR/verl, DIR/openrlhf: its staged pins, stage_peer_wheels.sh) whose site-packages goes first on that
peer's PYTHONPATH, then DIR/common's (the wheels all staged peers share).

    # GPU (4 GPUs: every run of the table at once where it can), the random Qwen2.5-7B built once:
    python benchmarks/peers/run_all.py --sites /tmp/peers --gpus 0,1,2,3 --shared \
        --frameworks roll_ma,trl,verl,trl_is@1,openrlhf@1 --out-dir /tmp/peers_out
    # CPU check of the driver itself: roll_ma and TRL (no vLLM) on a tiny model, the job shrunk
    python benchmarks/peers/run_all.py --device cpu --smoke --frameworks roll_ma,trl --agents 3 --out-dir /tmp

A framework name may carry ``@N[+N]`` (``openrlhf@1``): only those N. Variants, each a peer's default
that runs one more scoring pass per step than the table's rows: ``trl_is`` (TRL's importance-sampling
correction on), ``verl_recompute`` (verl recomputes pi_old in a forward instead of vLLM's log-probs); and
``roll_ma_turnwise``: roll_ma decoding one round per turn (env.decode_ahead=false), its rollout before
SeatGame planned its turns; ``roll_ma_lora_bf16``: roll_ma with its LoRA branches in bf16
(train.lora_compute_dtype=model); ``roll_ma_liger``: with liger-kernel's fused kernels (model.liger_kernel).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(HERE), str(HERE.parent)]

from job import Job, is_oom, load_job, read_result  # noqa: E402

# labelled variants: a peer's default where it runs one more scoring pass than the table's rows, and
# roll_ma's rollout of one round per turn (the before of env.decode_ahead)
VARIANTS = {
    "trl_is": ("trl", ["--is-correction"]),  # TRL's default importance-sampling correction on
    "verl_recompute": ("verl", ["--recompute-old-log-probs"]),  # verl's default: pi_old recomputed
    "roll_ma_turnwise": ("roll_ma", ["--turnwise"]),
    "roll_ma_lora_bf16": ("roll_ma", ["--lora-bf16"]),  # train.lora_compute_dtype=model, not yet the default
    "roll_ma_liger": ("roll_ma", ["--liger"]),  # model.liger_kernel, not yet the default
}
FRAMEWORKS = ("roll_ma", "trl", "verl", "openrlhf", *VARIANTS)


def base_framework(framework: str) -> str:
    """The framework a row's runs use (a variant's peer)."""
    return VARIANTS.get(framework, (framework, []))[0]


RUNNERS = {f: HERE / f"run_{base_framework(f)}.py" for f in FRAMEWORKS}
PHASES = ("rollout", "scoring", "old_log_probs", "update", "sync")
COLUMNS = [
    "framework",
    "agents",
    "adapters",
    "runs",
    "step_s",
    "step_min_s",
    "step_max_s",
    "vs_roll_ma",
    "tokens_per_s",
    "first_step_end_s",
    "phases",
    "gpu",
    "gpu_peak_gb",
    "status",
]


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
    framework: str, n_agents: int, agent: int | None, shared: bool, model: str, args: argparse.Namespace
) -> list[str]:
    """The runner's command line of one run: a peer's run trains ``agent``, or with ``shared`` one adapter
    on every seat's rows; roll_ma's one run trains every agent (``shared``: on one adapter)."""
    cmd = [sys.executable, str(RUNNERS[framework]), "--agents", str(n_agents), "--model", model]
    if args.job:
        cmd += ["--job", args.job]
    if shared:
        cmd.append("--shared")
    elif base_framework(framework) != "roll_ma":
        cmd += ["--agent", str(agent)]
    cmd += VARIANTS.get(framework, (framework, []))[1]
    if base_framework(framework) in ("roll_ma", "trl"):
        cmd += ["--device", args.device] + (["--smoke"] if args.smoke else [])
    if base_framework(framework) == "trl" and args.device == "cpu":
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


def runner_env(framework: str, sites: Path | None, gpu: str | None = None) -> dict[str, str]:
    """The environment of one run: the peer's own site folder first, then the repo (job.py imports
    roll_ma's SeatGame), then what the caller had (the staged roll_ma stack); pinned to GPU ``gpu``."""
    # no rendezvous of the caller's: a process that already ran torch.distributed (a test session that
    # built DeepSpeed engines) left RANK / WORLD_SIZE behind, and each peer's launcher sets its own
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARS}
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    site = base_framework(framework)
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


def run_process(cmd: list[str], env: dict[str, str], timeout: int) -> tuple[str, int | None]:
    """(output, exit code; None on timeout) of ``cmd`` in its own session; afterwards every process
    left in that session (Ray workers, vLLM engine cores) is killed, so the next run gets a free GPU."""
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    LIVE_SESSIONS.add(proc.pid)
    try:
        output, _ = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        output, _ = proc.communicate()
        code = None
    finally:
        kill_session(proc.pid)  # the session's leftovers (its leader has exited)
        LIVE_SESSIONS.discard(proc.pid)
    return output, code


def run_tag(framework: str, n_agents: int, agent: int | None, shared: bool) -> str:
    who = "_shared" if shared else (f"_agent{agent}" if agent is not None else "")
    return f"{framework}_{n_agents}agents{who}"


def run_one(
    framework: str,
    n_agents: int,
    agent: int | None,
    shared: bool,
    model: str,
    args: argparse.Namespace,
    gpu: str | None = None,
) -> dict[str, Any]:
    """One runner process on GPU ``gpu``: its result line, its log file, the GPU peak seen while it ran."""
    cmd = runner_command(framework, n_agents, agent, shared, model, args)
    tag = run_tag(framework, n_agents, agent, shared)
    log_path = Path(args.out_dir) / f"{tag}.log"
    print(f"[run_all] {tag} on GPU {gpu}: {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    with GpuPeak(gpu) as peak:
        output, code = run_process(cmd, runner_env(framework, args.sites, gpu), args.timeout)
    log_path.write_text(output[-200_000:])  # the tail: engines log a lot, and the device returns few MB
    result = read_result(output) or {
        "error": f"no result line (exit code {code}; timeout {args.timeout} s)"
        if code is None
        else f"no result line (exit code {code})",
        "oom": is_oom(output),
    }
    # the run's identity as this driver planned it (a runner's own fields cannot mislabel a row)
    result.update(framework=framework, agents=n_agents, agent=agent, shared=shared, host=socket.gethostname())
    result.update(gpu_peak_gb=peak.peak_gb, wall_s=round(time.perf_counter() - start, 1), log=str(log_path))
    if gpu is not None:
        result.setdefault("gpu_index", gpu)
    print(f"[run_all] {tag}: step_s={result.get('step_s')} error={result.get('error')}", flush=True)
    return result


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


def combine(framework: str, n_agents: int, shared: bool, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One table row. roll_ma, or any shared-adapter run: its one run. A peer: its N per-agent runs
    summed (median, min and max step time, response tokens, each phase), the largest GPU peak, the first
    error; a row missing any of its runs has no step time."""
    expected = 1 if (base_framework(framework) == "roll_ma" or shared) else n_agents
    errors = [r["error"] for r in runs if r.get("error")]
    complete = len(runs) == expected and all(r.get("step_s") is not None for r in runs)
    step_s = _sum([r.get("step_s") for r in runs]) if complete else None
    tokens = _sum([r.get("response_tokens_per_step") for r in runs])
    phases = {}
    for name in sorted({k for r in runs for k, v in (r.get("phases_s") or {}).items() if v is not None}):
        phases[name] = _sum([(r.get("phases_s") or {}).get(name) for r in runs])
    names = sorted({r.get("gpu_name") or "?" for r in runs})
    hosts = sorted({r.get("host") or "?" for r in runs})
    peaks = [r["gpu_peak_gb"] for r in runs if r.get("gpu_peak_gb") is not None]
    firsts = [r["first_step_end_s"] for r in runs if r.get("first_step_end_s") is not None]
    status = errors[0] if errors else ("ok" if complete else f"incomplete: {len(runs)} of {expected} runs")
    if complete and len(hosts) > 1:
        status = f"ok, runs from {len(hosts)} machines"
    return {
        "framework": framework,
        "agents": n_agents,
        "adapters": "1 shared" if shared else ("1" if n_agents == 1 else "1 per agent"),
        "shared": shared,
        "runs": f"{len(runs)}/{expected}",
        "step_s": step_s,
        "step_min_s": _sum([r.get("step_min_s") for r in runs]) if complete else None,
        "step_max_s": _sum([r.get("step_max_s") for r in runs]) if complete else None,
        "tokens_per_s": round(tokens / step_s, 1) if step_s and tokens else None,
        # start-up + step 1 of the slowest of the row's runs (runs on several GPUs start together)
        "first_step_end_s": max(firsts) if firsts else None,
        "phases_s": phases or None,
        "phases": ", ".join(f"{k} {v:.2f}" for k, v in phases.items() if v is not None) or None,
        "gpu": names[0] if len(names) == 1 else "mixed: " + ", ".join(names),
        "gpu_peak_gb": max(peaks) if peaks else None,
        "oom": any(r.get("oom") for r in runs),
        "status": status,
        "settings": next((r["settings"] for r in runs if r.get("settings")), None),
        "passes": next((r["passes"] for r in runs if r.get("passes")), None),
    }


def run_key(r: dict[str, Any]) -> tuple[str, int, int | None, bool]:
    return r["framework"], r["agents"], r.get("agent"), bool(r.get("shared"))


def table_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The table: one row per (N, per-agent or shared, framework) that has runs, N first."""
    keys = sorted({(r["agents"], bool(r.get("shared")), r["framework"]) for r in runs},
                  key=lambda k: (k[0], k[1], FRAMEWORKS.index(k[2])))  # fmt: skip
    rows = [
        combine(
            f, n, sh, [r for r in runs if (r["agents"], bool(r.get("shared")), r["framework"]) == (n, sh, f)]
        )
        for n, sh, f in keys
    ]
    add_ratios(rows)
    return rows


def merge_runs(previous: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``previous`` runs (of earlier calls with the same --out-dir) with those of this call added; a run
    of the same (framework, N, agent, shared) is replaced."""
    fresh = {run_key(r) for r in new}
    return [r for r in previous if run_key(r) not in fresh] + list(new)


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """vs_roll_ma = the row's step time / roll_ma's at the same N and adapter layout (> 1: roll_ma is
    faster), only where both rows ran on one GPU model (a row of mixed GPUs gets none)."""
    ours = {(r["agents"], r["shared"]): r for r in rows if r["framework"] == "roll_ma" and r["step_s"]}
    for r in rows:
        base = ours.get((r["agents"], r["shared"]))
        same_gpu = base is not None and base["gpu"] == r["gpu"] and not r["gpu"].startswith("mixed")
        r["vs_roll_ma"] = round(r["step_s"] / base["step_s"], 2) if same_gpu and r["step_s"] else None


# Minutes one run took on an H100 with 2026-11-27's job (start-up + 7 steps; verl starts in ~6.5 min):
# (framework, whole step in one run) -> minutes. The plan starts the longest runs first.
RUN_MINUTES = {
    ("verl", True): 13.0,
    ("verl", False): 9.0,
    ("roll_ma", True): 6.2,
    ("openrlhf", True): 3.9,
    ("trl", True): 3.5,
    ("trl", False): 2.1,
}


def plan_runs(
    frameworks: list[tuple[str, set[int] | None]], agents: list[int], shared: bool
) -> list[tuple[str, int, int | None, bool]]:
    """Every run of the table, as (framework, N, agent, shared), longest first (RUN_MINUTES: the GPUs
    then finish close together) within three groups: the frameworks' own rows, then roll_ma's variants
    and OpenRLHF (its row is a failure shown once), then the peers' labelled variants (a run_all stopped
    by its time limit loses those first)."""
    runs = []
    for n in agents:
        for framework, only in frameworks:
            if only is not None and n not in only:
                continue
            runs += (
                [(framework, n, None, False)]
                if base_framework(framework) == "roll_ma"
                else [(framework, n, a, False) for a in range(n)]
            )
            if shared and n > 1:
                runs.append((framework, n, None, True))

    def order(run: tuple[str, int, int | None, bool]) -> tuple[int, float]:
        framework, n, agent, _ = run
        base = base_framework(framework)
        if framework in VARIANTS:
            group = 1 if base == "roll_ma" else 2
        else:
            group = 1 if base == "openrlhf" else 0
        whole_step = base == "roll_ma" or agent is None or n == 1  # every row of a step in one run
        return group, -RUN_MINUTES.get((base, whole_step), 5.0)

    return sorted(runs, key=order)


def parse_frameworks(text: str) -> list[tuple[str, set[int] | None]]:
    """``roll_ma,trl,openrlhf@1`` -> [(name, only these N or None)]; unknown names are refused."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, only = item.partition("@")
        if name not in FRAMEWORKS:
            raise ValueError(f"--frameworks {name!r}: known are {', '.join(FRAMEWORKS)}")
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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from common import markdown_table

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--frameworks",
        default="roll_ma,trl,verl,openrlhf",
        help="comma list; a name may end in @N[+N] (only those N); known: " + ", ".join(FRAMEWORKS),
    )
    p.add_argument("--agents", default=None, help="comma list of N (default: the job's agents)")
    p.add_argument("--shared", action="store_true", help="also one shared-adapter run per framework, N > 1")
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
        frameworks = parse_frameworks(args.frameworks)
    except ValueError as exc:
        p.error(str(exc))
    job = load_job(args.job) if args.job else load_job()
    agents = [int(n) for n in args.agents.split(",")] if args.agents else list(job.agents)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = args.model or build_model(job, args.device, out_dir)
    gpus: list[str | None] = [g.strip() for g in args.gpus.split(",")] if args.device == "cuda" else [None]
    todo: queue.Queue = queue.Queue()
    for run in plan_runs(frameworks, agents, args.shared):
        todo.put(run)
    saved = out_dir / "peers.json"
    lock = threading.Lock()
    stagger = StartStagger(args.stagger_s if args.stagger_s is not None else (45.0 if len(gpus) > 1 else 0.0))
    summary: dict[str, Any] = {}

    def record(result: dict[str, Any]) -> None:
        """Merge one finished run into peers.json / peers.md (the table so far)."""
        previous = json.loads(saved.read_text()).get("runs", []) if saved.exists() else []
        runs = merge_runs(previous, [result])
        rows = table_rows(runs)
        stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        summary.update(date=stamp, job=job.source, model=model, device=args.device, rows=rows, runs=runs)
        saved.write_text(json.dumps(summary, indent=1))
        (out_dir / "peers.md").write_text(markdown_table(COLUMNS, rows) + "\n")

    def worker(gpu: str | None) -> None:
        while True:
            try:
                framework, n, agent, shared = todo.get_nowait()
            except queue.Empty:
                return
            stagger.wait_turn()
            result = run_one(framework, n, agent, shared, model, args, gpu)
            with lock:
                record(result)

    previous = signal.signal(signal.SIGTERM, stop_all_runs)
    threads = [threading.Thread(target=worker, args=(g,)) for g in gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    signal.signal(signal.SIGTERM, previous)
    if summary:
        print(markdown_table(COLUMNS, summary["rows"]), flush=True)
    return summary


if __name__ == "__main__":
    main()
