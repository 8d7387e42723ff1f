"""Runs sharing one CPU machine: the update time of a tiny CPU run alone, then of N such runs at once.

Each run is the CLI on a shipped config (``--config``, default ``math_selfplay_tiny``) for ``--steps``
steps, with its own output dir; the first step is a warm-up and not counted. What a run spends in its
update (``timing/update``) and its whole step (``timing/step``) come from its metrics.jsonl. ``--repo``
runs another checkout's code (e.g. the main branch, for a before/after pair); ``--env KEY=VALUE``
adds variables to every run (e.g. ``OMP_WAIT_POLICY=PASSIVE``)::

    python benchmarks/shared_cpu_runs.py --steps 5 --counts 1,2
    python benchmarks/shared_cpu_runs.py --repo /path/to/other/checkout --env OMP_WAIT_POLICY=PASSIVE
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import int_list, machine, markdown_table

REPO = Path(__file__).resolve().parents[1]


def launch(repo: Path, config: str, steps: int, out: Path, env: dict[str, str],
           extra: list[str]) -> subprocess.Popen:
    cmd = [sys.executable, str(repo / "start_pipeline.py"), "--config_name", config,
           f"trainer.max_steps={steps}", "trainer.eval_every=0", "trainer.progress_bars=false",
           f"trainer.output_dir={out}", *extra]
    log = open(out.with_suffix(".log"), "w")
    return subprocess.Popen(cmd, cwd=repo, env={**os.environ, "PYTHONPATH": str(repo), **env},
                            stdout=log, stderr=subprocess.STDOUT)


def times(out: Path, key: str) -> list[float]:
    """``key`` of every step after the first (the warm-up)."""
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [r[key] for r in rows if r.get("step", 0) > 1 and key in r]


def measure(args: argparse.Namespace, runs: int, root: Path) -> dict:
    """``runs`` runs started together; the update and step times of all of them, pooled."""
    env = dict(kv.split("=", 1) for kv in args.env)
    outs = [root / f"n{runs}_run{i}" for i in range(runs)]
    start = time.perf_counter()
    procs = [launch(args.repo, args.config, args.steps, out, env, args.overrides) for out in outs]
    codes = [p.wait() for p in procs]
    wall = time.perf_counter() - start
    for out, code in zip(outs, codes):
        if code != 0:
            sys.exit(f"a run failed ({code}); its output: {out.with_suffix('.log')}")
    update = [t for out in outs for t in times(out, "timing/update")]
    step = [t for out in outs for t in times(out, "timing/step")]
    return {"runs at once": runs, "update s median": statistics.median(update), "update s min": min(update),
            "update s max": max(update), "step s median": statistics.median(step), "wall s (all runs)": wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="math_selfplay_tiny")
    p.add_argument("--steps", type=int, default=5, help="steps per run; the first is not counted")
    p.add_argument("--counts", type=int_list, default=[1, 2], help="runs at once, one measurement each")
    p.add_argument("--repo", type=Path, default=REPO, help="the checkout whose code runs")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for every run (repeatable)")
    p.add_argument("--out", help="write the rows as JSON here")
    p.add_argument("overrides", nargs="*", help="key=value overrides of every run")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="shared_cpu_runs_") as tmp:
        rows = [measure(args, n, Path(tmp)) for n in args.counts]
    print(markdown_table(list(rows[0]), rows))
    summary = {"config": args.config, "repo": str(args.repo), "env": args.env, "rows": rows}
    print("JSON " + json.dumps(summary))
    print(f"machine: {machine()}; cores this process may use: {len(os.sched_getaffinity(0))}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
