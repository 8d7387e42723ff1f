"""Run verl's and ROLL's own DataProto tests against roll_ma.protocol through a name-only shim.

    PYTHONPATH=$PWD python benchmarks/protocol_compat/run_peer_suites.py [--verl REPO] [--roll REPO]

A suite's test file is read at run time from a checkout or a bare git mirror of the peer project
(``git show REV:PATH``; defaults: the fetched mirrors under /work/.mirror) or from ``--verl-file`` /
``--roll-file``, copied into a temporary directory and run there with pytest. Nothing of the peers is
kept in this repository. ``shim/`` maps their import names (``verl.protocol``,
``roll.distributed.scheduler.protocol``, ...) onto roll_ma and renames arguments, nothing more.

Prints per suite: every test with passed / failed and the failure's first line; whether each failure is
listed as a deliberate difference in docs/dataproto.md (``documented``) or not (``UNDOCUMENTED``); then
one ``JSON {...}`` summary line. ``--out FILE.json`` writes the whole result. Exit status 0 unless a
suite could not run at all.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DIFFERENCES_DOC = ROOT / "docs" / "dataproto.md"


@dataclass(frozen=True)
class Suite:
    name: str
    default_repo: str
    test_path: str  # inside the peer repository


SUITES = (
    Suite("verl", "/work/.mirror/volcengine+verl/repo", "tests/test_protocol_on_cpu.py"),
    Suite("roll", "/work/.mirror/alibaba+ROLL/repo", "tests/distributed/scheduler/test_protocol.py"),
)


@dataclass
class Outcome:
    test: str
    passed: bool
    reason: str = ""
    documented: bool = False


def read_peer_test(suite: Suite, repo: str, rev: str, file: str | None) -> tuple[str, str]:
    """(the test file's text, where it came from)."""
    if file:
        return Path(file).read_text(), file
    out = subprocess.run(
        ["git", "-C", repo, "show", f"{rev}:{suite.test_path}"], capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise SystemExit(
            f"{suite.name}: cannot read {suite.test_path} at {rev} from {repo}: {out.stderr.strip()}\n"
            f"fix: pass --{suite.name} <checkout or git dir> or --{suite.name}-file <test file>"
        )
    commit = subprocess.run(
        ["git", "-C", repo, "rev-parse", "--short", rev], capture_output=True, text=True, check=False
    ).stdout.strip()
    return out.stdout, f"{repo}@{commit}:{suite.test_path}"


def documented_tests(doc: Path = DIFFERENCES_DOC) -> set[str]:
    """``suite::test`` names listed in the differences table of docs/dataproto.md (first column)."""
    if not doc.exists():
        return set()
    return set(re.findall(r"^\|\s*`((?:verl|roll)::test_\w+)`", doc.read_text(), flags=re.M))


def run_suite(suite: Suite, source: str) -> list[Outcome]:
    with tempfile.TemporaryDirectory(prefix=f"peer_{suite.name}_") as tmp:
        test_file = Path(tmp) / f"test_peer_{suite.name}.py"
        test_file.write_text(source)
        report = Path(tmp) / "report.xml"
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(HERE / "shim"), str(ROOT), env.get("PYTHONPATH", "")])
        # cwd and rootdir in the temp dir: the peer tests write files into cwd; no ini file of ours applies
        subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--rootdir={tmp}",
             f"--junitxml={report}", test_file.name],
            cwd=tmp, env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if not report.exists():
            raise SystemExit(f"{suite.name}: pytest wrote no report (the file could not be collected?)")
        return parse_junit(report, suite.name)


def parse_junit(report: Path, suite: str) -> list[Outcome]:
    outcomes = []
    for case in ET.parse(report).getroot().iter("testcase"):
        problem = next((c for c in case if c.tag in ("failure", "error")), None)
        skipped = next((c for c in case if c.tag == "skipped"), None)
        if skipped is not None:
            reason = f"skipped: {skipped.get('message')}"
            outcomes.append(Outcome(f"{suite}::{case.get('name')}", False, reason))
            continue
        reason = ""
        if problem is not None:
            reason = (problem.get("message") or problem.text or "").strip().splitlines()[0][:160]
        outcomes.append(Outcome(f"{suite}::{case.get('name')}", problem is None, reason))
    return outcomes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for suite in SUITES:
        parser.add_argument(f"--{suite.name}", default=suite.default_repo, help="checkout or git dir")
        parser.add_argument(f"--{suite.name}-rev", default="HEAD")
        parser.add_argument(f"--{suite.name}-file", default=None, help="the test file itself")
    parser.add_argument("--only", choices=[s.name for s in SUITES], default=None)
    parser.add_argument("--out", default=None, help="write the whole result as JSON")
    opts = parser.parse_args(argv)

    documented = documented_tests()
    summary, results = {}, {}
    for suite in SUITES:
        if opts.only and suite.name != opts.only:
            continue
        repo, rev, file = (getattr(opts, suite.name + tail) for tail in ("", "_rev", "_file"))
        source, origin = read_peer_test(suite, repo, rev, file)
        outcomes = run_suite(suite, source)
        for o in outcomes:
            o.documented = not o.passed and o.test in documented
        passed = sum(o.passed for o in outcomes)
        undocumented = [o.test for o in outcomes if not o.passed and not o.documented]
        print(f"\n## {suite.name}: {passed}/{len(outcomes)} passed  ({origin})")
        for o in outcomes:
            status = "passed" if o.passed else "failed, " + ("documented" if o.documented else "UNDOCUMENTED")
            print(f"  {status:22s} {o.test.split('::')[1]}" + (f"  -- {o.reason}" if o.reason else ""))
        summary[suite.name] = {"passed": passed, "total": len(outcomes), "undocumented": undocumented}
        results[suite.name] = {"source": origin, "tests": [asdict(o) for o in outcomes]}
    print("JSON " + json.dumps(summary))
    if opts.out:
        Path(opts.out).write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
