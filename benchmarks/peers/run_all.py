"""Run the side-by-side job through roll_ma and each peer, one run after another, and write the table.

For every N in the job's ``agents``: roll_ma once (all N agents in one run), each peer N times (one run
per agent, on that agent's share of the same episodes). A peer's row sums its runs' median step times
and response tokens (the work of one roll_ma step) and takes the largest GPU peak. The GPU peak of every
run is sampled from ``nvidia-smi`` (the whole GPU, every process: engines and Ray workers included).

Each framework runs in its own Python environment: ``--sites DIR`` holds one folder per peer (DIR/trl,
DIR/verl, DIR/openrlhf: its staged pins, stage_peer_wheels.sh) whose site-packages goes first on that
peer's PYTHONPATH, then DIR/common's (the wheels all staged peers share).

    # GPU: the random Qwen2.5-7B is built once; results and every run's log under --out-dir, where each
    # call adds its runs to the table (a device call lasts <= 10 min: one 7B run or two per call)
    R="python benchmarks/peers/run_all.py --sites /tmp/peers --out-dir /tmp/peers_out"
    $R --frameworks roll_ma                          # roll_ma at N = 1 and 3
    $R --frameworks trl --agents 3 --agent 0         # one peer run per call ...
    $R --frameworks verl --agents 3 --peer-runs 1    # ... or 1 of the N runs, the row estimated as N x it
    # CPU check of the driver itself: roll_ma and TRL (no vLLM) on a tiny model, the job shrunk
    python benchmarks/peers/run_all.py --device cpu --smoke --frameworks roll_ma,trl --agents 3 --out-dir /tmp
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
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

FRAMEWORKS = ("roll_ma", "trl", "verl", "openrlhf")
RUNNERS = {f: HERE / f"run_{f}.py" for f in FRAMEWORKS}
COLUMNS = [
    "framework",
    "agents",
    "runs",
    "step_s",
    "vs_roll_ma",
    "tokens_per_s",
    "gpu_peak_gb",
    "oom",
    "status",
]


class GpuPeak:
    """The largest ``memory.used`` nvidia-smi reports while it runs (None without nvidia-smi)."""

    def __init__(self) -> None:
        self.peak_mib: float | None = None
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuPeak:
        if shutil.which("nvidia-smi"):
            cmd = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-lms", "500"]
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
    framework: str, n_agents: int, agent: int | None, model: str, args: argparse.Namespace
) -> list[str]:
    cmd = [sys.executable, str(RUNNERS[framework]), "--agents", str(n_agents), "--model", model]
    if args.job:
        cmd += ["--job", args.job]
    if agent is not None:
        cmd += ["--agent", str(agent)]
    if framework in ("roll_ma", "trl"):
        cmd += ["--device", args.device] + (["--smoke"] if args.smoke else [])
    if framework == "trl" and args.device == "cpu":
        cmd.append("--no-vllm")
    if framework == "openrlhf":
        cmd.append("--flash-attn-shim")
    return cmd


DISTRIBUTED_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                    "CROSS_RANK", "CROSS_SIZE")


def runner_env(framework: str, sites: Path | None) -> dict[str, str]:
    """The environment of one run: the peer's own site folder first, then the repo (job.py imports
    roll_ma's SeatGame), then what the caller had (the staged roll_ma stack)."""
    # no rendezvous of the caller's: a process that already ran torch.distributed (a test session that
    # built DeepSpeed engines) left RANK / WORLD_SIZE behind, and each peer's launcher sets its own
    env = {k: v for k, v in os.environ.items() if k not in DISTRIBUTED_VARS}
    paths = [str(REPO)]
    # DIR/<peer>/site-packages (install_peer_wheels.sh): dill, hashing a datasets.Dataset, pickles by value
    # any module outside a site-packages folder, and pyarrow by value does not pickle (MonthDayNano)
    if sites is not None and (sites / framework / "site-packages").is_dir():  # its pins, then the shared
        paths[:0] = [str(sites / name / "site-packages") for name in (framework, "common")
                     if (sites / name / "site-packages").is_dir()]
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_process(cmd: list[str], env: dict[str, str], timeout: int) -> tuple[str, int | None]:
    """(output, exit code; None on timeout) of ``cmd`` in its own session; afterwards every process
    left in that session (Ray workers, vLLM engine cores) is killed, so the next run gets a free GPU."""
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )

    def kill_session(*_: Any) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def on_term(*_: Any) -> None:  # run_all itself stopped (an outer `timeout`): take the run down with it
        kill_session()
        sys.exit(143)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        output, _ = proc.communicate(timeout=timeout)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        kill_session()
        output, _ = proc.communicate()
        code = None
    finally:
        signal.signal(signal.SIGTERM, previous)
    kill_session()  # the session's leftovers (its leader has exited)
    return output, code


def run_one(
    framework: str, n_agents: int, agent: int | None, model: str, args: argparse.Namespace
) -> dict[str, Any]:
    """One runner process: its result line, its log file, the GPU peak seen while it ran."""
    cmd = runner_command(framework, n_agents, agent, model, args)
    tag = f"{framework}_{n_agents}agents" + (f"_agent{agent}" if agent is not None else "")
    log_path = Path(args.out_dir) / f"{tag}.log"
    print(f"[run_all] {tag}: {' '.join(cmd)}", flush=True)
    start = time.perf_counter()
    with GpuPeak() as gpu:
        output, code = run_process(cmd, runner_env(framework, args.sites), args.timeout)
    log_path.write_text(output[-200_000:])  # the tail: engines log a lot, and the device returns few MB
    result = read_result(output) or {
        "framework": framework,
        "agents": n_agents,
        "agent": agent,
        "oom": is_oom(output),
        "error": f"no result line (exit code {code}; timeout {args.timeout} s)"
        if code is None
        else f"no result line (exit code {code})",
    }
    result.update(gpu_peak_gb=gpu.peak_gb, wall_s=round(time.perf_counter() - start, 1), log=str(log_path))
    print(f"[run_all] {tag}: step_s={result.get('step_s')} error={result.get('error')}", flush=True)
    return result


def combine(framework: str, n_agents: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One table row. roll_ma: its one run. A peer: its N per-agent runs summed (step time, response
    tokens), the largest GPU peak, the first error. With only k < N of them measured (``--peer-runs``;
    the runs differ only in their prompts' text), the sum is estimated as N / k times theirs."""
    expected = 1 if framework == "roll_ma" else n_agents
    steps = [r.get("step_s") for r in runs]
    tokens = [r.get("response_tokens_per_step") for r in runs]
    errors = [r["error"] for r in runs if r.get("error")]
    complete = bool(runs) and all(s is not None for s in steps)
    scale = expected / len(runs) if runs else 1.0
    step_s = scale * sum(steps) if complete else None
    peaks = [r["gpu_peak_gb"] for r in runs if r.get("gpu_peak_gb") is not None]
    status = errors[0] if errors else ("ok" if complete else "incomplete")
    if complete and not errors and len(runs) < expected:
        status = f"ok, estimated from {len(runs)} of {expected} runs"
    return {
        "framework": framework,
        "agents": n_agents,
        "runs": f"{len(runs)}/{expected}",
        "step_s": round(step_s, 3) if step_s else None,
        "tokens_per_s": round(scale * sum(tokens) / step_s, 1) if step_s and all(tokens) else None,
        "gpu_peak_gb": max(peaks) if peaks else None,
        "oom": any(r.get("oom") for r in runs),
        "status": status,
    }


def table_rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The table: one row per (N, framework) that has runs, in the order N, then FRAMEWORKS."""
    keys = sorted({(r["agents"], r["framework"]) for r in runs}, key=lambda k: (k[0], FRAMEWORKS.index(k[1])))
    rows = [combine(f, n, [r for r in runs if (r["agents"], r["framework"]) == (n, f)]) for n, f in keys]
    add_ratios(rows)
    return rows


def merge_runs(previous: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``previous`` runs (of earlier calls with the same --out-dir) with those of this call added; a run
    of the same (framework, N, agent) is replaced."""
    key = lambda r: (r["framework"], r["agents"], r.get("agent"))  # noqa: E731
    fresh = {key(r) for r in new}
    return [r for r in previous if key(r) not in fresh] + list(new)


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """vs_roll_ma = the row's step time / roll_ma's at the same N (> 1: roll_ma is faster)."""
    ours = {r["agents"]: r["step_s"] for r in rows if r["framework"] == "roll_ma" and r["step_s"]}
    for r in rows:
        base = ours.get(r["agents"])
        r["vs_roll_ma"] = round(r["step_s"] / base, 2) if base and r["step_s"] else None


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
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS), help="comma list, run in this order")
    p.add_argument("--agents", default=None, help="comma list of N (default: the job's agents)")
    p.add_argument("--model", default=None, help="model directory (default: built from the job)")
    p.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    p.add_argument("--job", default=None, help="job file (default: job.yaml beside this script)")
    p.add_argument("--smoke", action="store_true", help="roll_ma and TRL on the job shrunk to CPU size")
    p.add_argument(
        "--sites", type=Path, default=None, help="folder of per-peer site folders (stage_peer_wheels)"
    )
    p.add_argument("--timeout", type=int, default=3600, help="seconds per runner process")
    p.add_argument(
        "--peer-runs",
        type=int,
        default=None,
        help="run only the first K agents of each peer and estimate the row as N / K times their sum "
        "(the per-agent runs differ only in their prompts' text); default: all N",
    )
    p.add_argument("--agent", type=int, default=None, help="run only this agent's peer runs (a chunk)")
    p.add_argument(
        "--out-dir",
        required=True,
        help="results (peers.json, peers.md) and every run's log; runs of earlier calls there are kept",
    )
    args = p.parse_args(argv)
    frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    unknown = sorted(set(frameworks) - set(FRAMEWORKS))
    if unknown:
        p.error(f"--frameworks {unknown}: known are {', '.join(FRAMEWORKS)}")
    job = load_job(args.job) if args.job else load_job()
    agents = [int(n) for n in args.agents.split(",")] if args.agents else list(job.agents)
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = args.model or build_model(job, args.device, out_dir)
    new = []
    for n in agents:
        for framework in frameworks:
            per_agent = list(range(n if args.peer_runs is None else min(n, args.peer_runs)))
            if args.agent is not None:
                per_agent = [a for a in per_agent if a == args.agent]
            new += [
                run_one(framework, n, a, model, args)
                for a in ([None] if framework == "roll_ma" else per_agent)
            ]
    saved = out_dir / "peers.json"
    previous = json.loads(saved.read_text()).get("runs", []) if saved.exists() else []
    runs = merge_runs(previous, new)
    rows = table_rows(runs)
    table = markdown_table(COLUMNS, rows)
    stamp = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    summary = {
        "date": stamp,
        "job": job.source,
        "model": model,
        "device": args.device,
        "rows": rows,
        "runs": runs,
    }
    saved.write_text(json.dumps(summary, indent=1))
    (out_dir / "peers.md").write_text(table + "\n")
    print(table, flush=True)
    return summary


if __name__ == "__main__":
    main()
