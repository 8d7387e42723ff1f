"""Import check of a staged peer: what its run imports, not only what its wheels declare.

A wheel's declared requirements miss what a framework imports from a package it does not declare (verl
runs vLLM's OpenAI server, whose imports roll_ma's offline engine never needs) and what it imports late
(inside functions, in Ray actors), found on the GPU only after minutes of start-up. This installs the
staged wheels as the device does (no deps, ``--target``: the peer's own folder first, then common/, then
roll_ma's staged sets) and imports, with a local Python 3.12 that holds the GPU image's packages (torch
2.11, transformers, peft, accelerate, numpy, ...), the modules its requirements file lists on
``# import-check:`` lines. Every ModuleNotFoundError is listed with the module that needed it; any other
import error (no GPU, no CUDA driver here) is printed as a note only.

    python benchmarks/peers/import_check.py --python /path/to/py312 --bundle /tmp/peer_stage/bundle \\
        --roll-ma-wheels /tmp/stagework/bundle/wheels.tar verl
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

# what tools/device_install.sh exports on the device: offline, no flashinfer sampler
DEVICE_ENV = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
}

# run by the checked python: import each module in turn, report every failure as one JSON line
CHILD = r"""
import importlib, json, sys
out = []
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        out.append({"module": name, "ok": True, "missing": None, "error": None})
    except ModuleNotFoundError as exc:
        out.append({"module": name, "ok": False, "missing": exc.name, "error": str(exc)[:300]})
    except BaseException as exc:  # no GPU here, a version check, ...: a note, not a missing package
        error = f"{type(exc).__name__}: {exc}"[:300]
        out.append({"module": name, "ok": False, "missing": None, "error": error})
print("IMPORT_CHECK " + json.dumps(out))
"""


def import_check_modules(requirements: Path) -> list[str]:
    """The modules on the file's ``# import-check:`` lines, in order."""
    mods: list[str] = []
    for line in requirements.read_text().splitlines():
        if line.startswith("# import-check:"):
            mods += line.split(":", 1)[1].split()
    return mods


def pip_target(python: str, wheels: list[Path], target: Path) -> None:
    """Install ``wheels`` into ``target`` as install_peer_wheels.sh does on the device."""
    if not wheels:
        return
    cmd = [
        python,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--disable-pip-version-check",
        "--target",
        str(target),
        *map(str, wheels),
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def roll_ma_wheels(path: Path, work: Path) -> list[Path]:
    """roll_ma's staged wheels: stage_wheels.sh's wheels.tar (unpacked here) or a folder of wheels."""
    if path.is_dir():
        return sorted(path.glob("*.whl"))
    out = work / "roll_ma_wheels"
    out.mkdir()
    with tarfile.open(path) as tar:
        tar.extractall(out, filter="data")
    return sorted(out.rglob("*.whl"))


def import_modules(python: str, modules: list[str], pythonpath: str, cwd: Path) -> tuple[list | None, str]:
    """Import ``modules`` one by one in ``python`` (a fresh process, the device's environment variables):
    one {module, ok, missing, error} per module, None if the process died, and its output."""
    env = {**os.environ, **DEVICE_ENV, "PYTHONPATH": pythonpath}
    proc = subprocess.run(
        [python, "-c", CHILD, *modules],
        env=env,
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("IMPORT_CHECK ")), None)
    return (json.loads(line[len("IMPORT_CHECK ") :]) if line else None), proc.stdout


def check_peer(python: str, peer: str, bundle: Path, site: Path, work: Path) -> dict:
    """Install the peer's staged wheels and import its listed modules; {missing: {name: [modules]}, ...}."""
    modules = import_check_modules(HERE / f"requirements-{peer}.txt")
    if not modules:
        return {"peer": peer, "modules": 0, "missing": {}, "notes": ["no # import-check: lines"]}
    # <peer>/site-packages as on the device (install_peer_wheels.sh): dill pickles by value any module
    # outside a site-packages folder, which changes what datasets' fingerprinting imports
    own, common = work / peer / "site-packages", work / "common" / "site-packages"
    pip_target(python, sorted((bundle / peer).glob("*.whl")), own)
    if not common.exists():
        pip_target(python, sorted((bundle / "common").glob("*.whl")), common)
    path = [str(p) for p in (own, common, site) if p.exists()]
    results, output = import_modules(python, modules, os.pathsep.join(path), work)
    if results is None:
        return {"peer": peer, "modules": len(modules), "missing": {}, "crashed": output[-3000:]}
    missing: dict[str, list[str]] = {}
    notes = []
    for r in results:
        if r["ok"]:
            continue
        if r["missing"] == r["module"]:  # the listed module itself: a wrong name in the list, not a package
            notes.append(f"{r['module']}: no such module in the staged packages (fix the import-check list)")
            missing.setdefault(r["missing"], []).append(r["module"])
        elif r["missing"]:
            missing.setdefault(r["missing"], []).append(r["module"])
        else:
            notes.append(f"{r['module']}: {r['error']}")
    return {"peer": peer, "modules": len(modules), "missing": missing, "notes": notes}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", required=True, help="a Python 3.12 holding the GPU image's packages")
    p.add_argument("--bundle", required=True, type=Path, help="stage_peer_wheels.sh's bundle/")
    p.add_argument(
        "--roll-ma-wheels",
        required=True,
        type=Path,
        help="stage_wheels.sh's bundle/wheels.tar, or a folder of roll_ma's staged wheels",
    )
    p.add_argument("--keep", action="store_true", help="keep the installed folders (printed)")
    p.add_argument("peers", nargs="+")
    args = p.parse_args(argv)
    version = subprocess.run(
        [args.python, "-c", "import sys; print(sys.version_info[:2])"],
        text=True,
        stdout=subprocess.PIPE,
        check=True,
    ).stdout.strip()
    if version != "(3, 12)":
        raise SystemExit(f"--python {args.python} is Python {version}; the device runs 3.12")
    if not args.roll_ma_wheels.exists():
        raise SystemExit(
            f"{args.roll_ma_wheels} not found: SETS='vllm rl proj' bash ../shared/device/stage_wheels.sh"
        )
    work = Path(tempfile.mkdtemp(prefix="peer_import_check_"))
    site = work / "site"
    pip_target(args.python, roll_ma_wheels(args.roll_ma_wheels, work), site)
    failed = False
    for peer in args.peers:
        r = check_peer(args.python, peer, args.bundle, site, work)
        if "crashed" in r:
            print(f"{peer} import check: the checking python crashed:\n{r['crashed']}")
            failed = True
            continue
        ok = not r["missing"]
        verdict = "no module missing" if ok else f"{len(r['missing'])} missing (ModuleNotFoundError):"
        print(f"{peer} import check: {r['modules']} modules, {verdict}")
        for name, needed_by in sorted(r["missing"].items()):
            print(f"    {name} (imported on the way to {', '.join(needed_by)})")
        for note in r["notes"]:
            print(f"    note: {note}")
        failed |= not ok
    if args.keep:
        print(f"installed under {work} (PYTHONPATH=<peer>/site-packages:common/site-packages:site)")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
