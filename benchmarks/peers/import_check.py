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
    # on the device, after tools/device_install.sh and install_peer_wheels.sh (GPU errors are then real):
    python3 benchmarks/peers/import_check.py --sites /tmp/peers verl
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

# run by the checked python: import each module in turn. A missing package is replaced by a stub (any
# attribute is a fresh class) and the import retried, so one pass lists every missing package the modules
# reach, not only the first (the stub hides what the missing package itself imports: once it is staged,
# stage_peer_wheels.sh's requirements check names its own requirements, e.g. jmespath and supervisor for
# model_hosting_container_standards). A stub stays for the later modules, which then do not list it again.
# One JSON line: per module, the missing names in the order met and the error that ended it, if any.
CHILD = r"""
import importlib, json, sys, types

def stub(name):
    mod = types.ModuleType(name)
    mod.__path__ = []  # a package: its submodules are missing too, and stubbed in turn
    mod.__getattr__ = lambda attr: type(attr, (), {}) if not attr.startswith("__") else None
    sys.modules[name] = mod
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, mod)

out = []
for name in sys.argv[1:]:
    missing, error = [], None
    for _ in range(50):
        try:
            importlib.import_module(name)
            break
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name in missing or exc.name == name:
                error = f"ModuleNotFoundError: {exc}"[:300]
                missing += [] if exc.name in missing or exc.name is None else [exc.name]
                break
            if exc.name.split(".")[0] not in missing:  # a stub's submodule is no news
                missing.append(exc.name)
            stub(exc.name)
        except BaseException as exc:  # no GPU here, a version check, or a stub's limits: a note only
            error = f"{type(exc).__name__}: {exc}"[:300]
            break
    out.append({"module": name, "missing": missing, "error": error})
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
    one {module, missing: [names], error} per module, None if the process died, and its output."""
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


def install_peer(python: str, peer: str, bundle: Path, work: Path) -> list[Path]:
    """The peer's staged wheels and common/ installed as on the device: its folders, first on its path."""
    # <peer>/site-packages as on the device (install_peer_wheels.sh): dill pickles by value any module
    # outside a site-packages folder, which changes what datasets' fingerprinting imports
    own, common = work / peer / "site-packages", work / "common" / "site-packages"
    pip_target(python, sorted((bundle / peer).glob("*.whl")), own)
    if not common.exists():
        pip_target(python, sorted((bundle / "common").glob("*.whl")), common)
    return [p for p in (own, common) if p.exists()]


def installed_peer(peer: str, sites: Path) -> list[Path]:
    """The peer's folders under install_peer_wheels.sh's SITES (with or without a site-packages level)."""
    out = []
    for name in (peer, "common"):
        d = sites / name
        out += [d / "site-packages"] if (d / "site-packages").is_dir() else [d] if d.is_dir() else []
    return out


def check_peer(python: str, peer: str, path: list[Path], cwd: Path) -> dict:
    """Import the peer's listed modules with ``path`` first on PYTHONPATH; {missing: {name: [modules]},
    notes: [...]}."""
    modules = import_check_modules(HERE / f"requirements-{peer}.txt")
    if not modules:
        return {"peer": peer, "modules": 0, "missing": {}, "notes": ["no # import-check: lines"]}
    results, output = import_modules(python, modules, os.pathsep.join(map(str, path)), cwd)
    if results is None:
        return {"peer": peer, "modules": len(modules), "missing": {}, "crashed": output[-3000:]}
    missing: dict[str, list[str]] = {}
    notes = []
    for r in results:
        for name in r["missing"]:
            if name == r["module"]:  # the listed module itself: a wrong name in the list, not a package
                notes.append(f"{name}: no such module in the staged packages (fix the import-check list)")
            missing.setdefault(name, []).append(r["module"])
        if r["error"]:
            after = f" (after stubbing {', '.join(r['missing'])})" if r["missing"] else ""
            notes.append(f"{r['module']}: {r['error']}{after}")
    return {"peer": peer, "modules": len(modules), "missing": missing, "notes": notes}


def report(r: dict) -> bool:
    """Print one peer's result; whether it passed."""
    if "crashed" in r:
        print(f"{r['peer']} import check: the checking python crashed:\n{r['crashed']}")
        return False
    ok = not r["missing"]
    verdict = "no module missing" if ok else f"{len(r['missing'])} missing (ModuleNotFoundError):"
    print(f"{r['peer']} import check: {r['modules']} modules, {verdict}")
    for name, needed_by in r["missing"].items():
        print(f"    {name} (imported on the way to {', '.join(needed_by)})")
    for note in r["notes"]:
        print(f"    note: {note}")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", default=sys.executable, help="a Python 3.12 holding the GPU image's packages")
    p.add_argument("--bundle", type=Path, help="stage_peer_wheels.sh's bundle/ (install, then check)")
    p.add_argument(
        "--roll-ma-wheels",
        type=Path,
        help="with --bundle: stage_wheels.sh's bundle/wheels.tar, or a folder of roll_ma's staged wheels",
    )
    p.add_argument(
        "--sites",
        type=Path,
        help="on the device: install_peer_wheels.sh's SITES (/tmp/peers), already installed; roll_ma's "
        "stack from the PYTHONPATH that tools/device_install.sh exports",
    )
    p.add_argument("--keep", action="store_true", help="keep the installed folders (printed)")
    p.add_argument("peers", nargs="+")
    args = p.parse_args(argv)
    if (args.sites is None) == (args.bundle is None) or (args.bundle is not None and not args.roll_ma_wheels):
        p.error("give --sites DIR (installed) or --bundle DIR --roll-ma-wheels TAR (install here)")
    version = subprocess.run(
        [args.python, "-c", "import sys; print(sys.version_info[:2])"],
        text=True,
        stdout=subprocess.PIPE,
        check=True,
    ).stdout.strip()
    if version != "(3, 12)":
        raise SystemExit(f"--python {args.python} is Python {version}; the device runs 3.12")
    if args.sites is not None:  # the device: everything installed, roll_ma's /tmp/site on PYTHONPATH
        extra = [Path(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        ok = []
        for peer in args.peers:
            ok.append(
                report(check_peer(args.python, peer, installed_peer(peer, args.sites) + extra, Path.cwd()))
            )
        return 0 if all(ok) else 1
    if not args.roll_ma_wheels.exists():
        raise SystemExit(
            f"{args.roll_ma_wheels} not found: SETS='vllm rl proj' bash ../shared/device/stage_wheels.sh"
        )
    work = Path(tempfile.mkdtemp(prefix="peer_import_check_"))
    site = work / "site"
    pip_target(args.python, roll_ma_wheels(args.roll_ma_wheels, work), site)
    ok = []
    for peer in args.peers:
        path = install_peer(args.python, peer, args.bundle, work) + [site]
        ok.append(report(check_peer(args.python, peer, path, work)))
    if args.keep:
        print(f"installed under {work} (PYTHONPATH=<peer>/site-packages:common/site-packages:site)")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
