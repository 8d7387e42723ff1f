"""Merge the tables of several run_all calls of one job on one machine into one peers.json / peers.md.

``tools/gpu_campaign.sh chains`` runs one run_all per queue item and GPU, each with ``--repeats 1`` into its
own folder, so a row measured three times (GPUs swapped) is three tables whose runs all say repeat 0.
This puts them together: give the peers.json files in the order their runs started; a run's repeat is
renumbered by that order among the runs of its (row, N, agent, shared), and the table, its medians of the
repeats' medians with their spread, and the headline are rebuilt as run_all builds them.

    python benchmarks/peers/merge_tables.py docs/runs/X/g0job_1_peers.json docs/runs/X/g1job_1_peers.json \
        ... --repeats 3 --out-dir docs/runs/X
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

from job import load_job  # noqa: E402
from run_all import headline, run_key, table_rows, write_tables  # noqa: E402


def renumber(tables: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every table's runs in the given order, each run's repeat its place among the runs of its (row, N,
    agent, shared) so far."""
    seen: dict[tuple, int] = {}
    runs = []
    for table in tables:
        for run in table["runs"]:
            key = run_key(run)[:4]
            runs.append({**run, "repeat": seen.get(key, 0)})
            seen[key] = seen.get(key, 0) + 1
    return runs


def read_table(path: str) -> dict[str, Any]:
    """One run_all table (peers.json), or a one-line exit naming the file and what is wrong with it; a table
    that is itself a merge is refused (its runs would count twice beside the tables it came from)."""
    try:
        table = json.loads(Path(path).read_text())
    except OSError as err:
        raise SystemExit(f"merge_tables: cannot read {path}: {err.strerror or err}") from None
    except json.JSONDecodeError as err:
        raise SystemExit(f"merge_tables: {path} is not JSON ({err.msg}, line {err.lineno}): give run_all's "
                         "peers.json files") from None
    if not isinstance(table, dict) or "job" not in table or not isinstance(table.get("runs"), list):
        raise SystemExit(f"merge_tables: {path} is not a run_all table (no 'job' and 'runs')")
    if table.get("merged_from"):
        raise SystemExit(f"merge_tables: {path} is already a merge (of {len(table['merged_from'])} tables); "
                         "give the tables it was merged from")
    return table


def check_each_run_once(tables: list[dict[str, Any]], paths: list[str]) -> None:
    """A run (its log file) in two of the tables: the same file given twice, or overlapping tables."""
    seen: dict[str, str] = {}
    for table, path in zip(tables, paths):
        for run in table["runs"]:
            log = run.get("log")
            if log and log in seen:
                raise SystemExit(f"merge_tables: the run {log} is in {seen[log]} and in {path}: each run "
                                 "counts once")
            if log:
                seen[log] = path


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("tables", nargs="+", help="peers.json files of one job, in the order their runs started")
    p.add_argument("--repeats", type=int, default=None, help="planned repeats (default: the job's)")
    p.add_argument("--out-dir", required=True)
    args = p.parse_args(argv)
    tables = [read_table(t) for t in args.tables]
    check_each_run_once(tables, args.tables)
    jobs = {t["job"] for t in tables}
    if len(jobs) != 1:
        raise SystemExit(f"merge_tables: the tables are of different jobs ({sorted(jobs)}); merge one job's")
    job = load_job(jobs.pop())
    repeats = args.repeats or job.repeats
    runs = renumber(tables)
    rows = table_rows(job, runs, repeats)
    dates = sorted(t["date"] for t in tables if t.get("date"))  # the last table's: when its last run ended
    summary = {**tables[-1], "date": dates[-1] if dates else "-", "repeats": repeats,
               "headline": headline(rows), "rows": rows, "runs": runs, "merged_from": list(args.tables)}
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "peers.json").write_text(json.dumps(summary, indent=1))
    write_tables(out_dir, summary)
    print((out_dir / "peers.md").read_text())
    return summary


if __name__ == "__main__":
    main(sys.argv[1:])
