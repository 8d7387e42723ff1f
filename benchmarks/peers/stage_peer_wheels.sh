#!/usr/bin/env bash
# Stage the peers' wheels for the lent GPU machine (python 3.12, manylinux x86_64, NO network), beside
# roll_ma's own bundle (../shared/device/stage_wheels.sh -> .wbN, installed by tools/device_install.sh).
# Each peer's pins (requirements-<peer>.txt) go into that peer's own folder on the device, first on its
# PYTHONPATH only (run_all.py --sites /tmp/peers), so roll_ma's stack stays untouched; wheels all the
# staged peers share go once into common/, next on each peer's path.
#
# From the repo root:   PEERS="trl verl openrlhf" bash benchmarks/peers/stage_peer_wheels.sh
#   -> ignored folders .pw1 .. .pwN (one part <= CHUNK_MAX each; a part plus the working tree must stay
#      under 64 MiB per device call), and the MiB of each peer's set. Then on the device, one part per call:
#        source tools/device_install.sh; bash benchmarks/peers/install_peer_wheels.sh
#      (the last part's call installs /tmp/peers/<peer>/site-packages) and:
#        python benchmarks/peers/run_all.py --sites /tmp/peers --out-dir $OUT/peers
#   CHECK_ONLY=1: download and check, no parts written.
#
# The check: every pinned wheel exists for cp312 manylinux x86_64, and every requirement of every staged
# wheel (markers for python 3.12 on linux x86_64, no extras) is met by the peer's own set, by the GPU image
# or roll_ma's staged stack (PROVIDED below), or is a documented "# not-staged:" name of its requirements
# file. A requirement met by none fails the script and is listed.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=${REPO:-$(git -C "$HERE" rev-parse --show-toplevel)}
PEERS=${PEERS:-"trl verl openrlhf"}
W=${WORK:-/tmp/peer_stage}
PY=${PY:-python3}                        # any local python with pip; downloads target cp312 manylinux x86_64
CHUNK_MAX=${CHUNK_MAX:-$((55*1024*1024))}
PLAT=""; for t in manylinux_2_5 manylinux1 manylinux2014 manylinux_2_17 manylinux_2_24 manylinux_2_26 manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_35; do PLAT="$PLAT --platform ${t}_x86_64"; done
mkdir -p "$W/dl" "$W/slim"

whl() {  # the downloaded wheel of name==version, if any (wheel names use _ for - and may differ in case)
  local n; n=$(echo "$1" | tr '-' '_')
  find "$W/dl" -maxdepth 1 -iname "${n}-${2}-*.whl" | head -1
}
fetch() {  # name==version -> path of its cp312 wheel (a pure-python wheel built here for sdist-only pins)
  local n=${1%%==*} v=${1##*==} f
  f=$(whl "$n" "$v")
  if [ -z "$f" ]; then
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT -d "$W/dl" "$1" 2>/dev/null \
      || DS_BUILD_OPS=0 $PY -m pip wheel -q --no-deps "$1" -w "$W/dl" >/dev/null
    f=$(whl "$n" "$v")
  fi
  [ -n "$f" ] || { echo "no cp312 manylinux x86_64 wheel for $1" >&2; return 1; }
  case "$n" in  # slim Ray as roll_ma's bundle does: the Java jars and dashboard source maps are unused
    ray) local s="$W/slim/$(basename "$f")"
         [ -f "$s" ] || { cp "$f" "$s"; zip -q -d "$s" 'ray/jars/*' 'ray/dashboard/client/build/static/js/*.map' >/dev/null || true; }
         f=$s ;;
  esac
  echo "$f"
}

rm -rf "$W/bundle"; mkdir -p "$W/bundle"
for peer in $PEERS; do
  req="$HERE/requirements-$peer.txt"
  [ -f "$req" ] || { echo "unknown peer $peer (no $req)"; exit 1; }
  mkdir -p "$W/bundle/$peer"
  for pin in $(grep -Ev '^\s*(#|$)' "$req" | sed 's/\s*#.*//'); do
    cp "$(fetch "$pin")" "$W/bundle/$peer/"
  done
done

# a wheel EVERY peer stages (datasets, pyarrow, pandas, ...) goes once into common/, which run_all.py puts
# right after the peer's own folder (only a wheel all share: each peer still sees exactly its own pins)
NP=$(echo $PEERS | wc -w)
if [ "$NP" -gt 1 ]; then
  mkdir -p "$W/bundle/common"
  for f in $(cd "$W/bundle" && ls $PEERS | grep '\.whl$' | sort | uniq -c | awk -v n="$NP" '$1 == n {print $2}'); do
    for peer in $PEERS; do [ -f "$W/bundle/$peer/$f" ] && mv "$W/bundle/$peer/$f" "$W/bundle/common/$f"; done
  done
fi

# every requirement of every staged wheel is met (see the header)
$PY - "$W/bundle" "$HERE" $PEERS <<'PY'
import re, sys, zipfile
from pathlib import Path
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name as canon
from packaging.version import Version

# the GPU image (device README: torch 2.11, transformers 5.17, peft, accelerate, tensorboard, numpy, and
# what those require) and roll_ma's staged sets (stage_wheels.sh: vllm, rl, spiel, proj); None = any version
PROVIDED = {
    "torch": "2.11.0", "transformers": "5.17.0", "tokenizers": "0.23.1", "vllm": "0.25.0", "ray": "2.60.0",
    "deepspeed": "0.19.8", "tensordict": "0.15.3", "pyvers": "0.2.3", "hydra-core": "1.3.8", "omegaconf": "2.3.0",
    "pydantic": "2.14.3", "pydantic-core": "2.50.4", "typing-extensions": "4.16.0",
}
PROVIDED.update(dict.fromkeys(map(canon, """
    triton setuptools safetensors huggingface-hub hf-xet regex pyyaml tqdm filelock fsspec packaging numpy
    requests urllib3 idna certifi charset-normalizer httpx httpcore anyio h11 sniffio typer click rich shellingham
    markdown-it-py mdurl pygments peft accelerate psutil tensorboard tensorboard-data-server absl-py grpcio markdown
    protobuf werkzeug markupsafe jinja2 networkx sympy mpmath pillow cloudpickle msgpack py-cpuinfo
    annotated-types typing-inspection fastapi starlette openai distro jiter openai-harmony cachetools cbor2 msgspec
    pyzmq partial-json-parser pybase64 blake3 llguidance xgrammar apache-tvm-ffi jsonschema
    jsonschema-specifications referencing rpds-py hjson antlr4-python3-runtime math-verify latex2sympy2-extended
""".split()), None))
ENV = {"python_version": "3.12", "python_full_version": "3.12.0", "sys_platform": "linux", "platform_system": "Linux",
       "platform_machine": "x86_64", "implementation_name": "cpython", "platform_python_implementation": "CPython",
       "os_name": "posix", "extra": ""}

def metadata(wheel: Path) -> tuple[str, str, list[str]]:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(name).decode()
    field = lambda k: re.search(rf"^{k}: (.+)$", text, re.M).group(1).strip()
    return canon(field("Name")), field("Version"), re.findall(r"^Requires-Dist: (.+)$", text, re.M)

bundle, here, peers = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
failed = False
for peer in peers:
    own = sorted((bundle / peer).glob("*.whl"))
    wheels = own + sorted((bundle / "common").glob("*.whl"))
    staged = {n: v for n, v, _ in map(metadata, wheels)}
    skip = {canon(n) for line in (here / f"requirements-{peer}.txt").read_text().splitlines()
            if line.startswith("# not-staged:") for n in re.findall(r"[\w.-]+", line.split(":", 1)[1].split("(")[0])}
    unmet = []
    for wheel in wheels:
        owner, _, reqs = metadata(wheel)
        for text in reqs:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate(ENV):
                continue
            name = canon(req.name)
            have = staged.get(name, PROVIDED.get(name, "missing") if name in PROVIDED else "missing")
            if name in skip or (have != "missing" and (have is None or req.specifier.contains(Version(have), prereleases=True))):
                continue
            unmet.append(f"{text} (of {owner}; have {have})")
    mib, own_mib = (sum(w.stat().st_size for w in ws) / 2**20 for ws in (wheels, own))
    print(f"{peer}: {len(wheels)} wheels, {mib:.1f} MiB ({own_mib:.1f} MiB its own, the rest in common/); "
          + ("every requirement met" if not unmet else f"{len(unmet)} unmet:"))
    for u in sorted(set(unmet)):
        print(f"    {u}")
    failed |= bool(unmet)
common = sorted((bundle / "common").glob("*.whl"))
if common:
    print(f"common: {len(common)} wheels, {sum(w.stat().st_size for w in common) / 2**20:.1f} MiB")
sys.exit(1 if failed else 0)
PY

[ -n "${CHECK_ONLY:-}" ] && exit 0
# one uncompressed tar (peer/wheel.whl), split into equal parts <= CHUNK_MAX, in ignored folders .pwN
TAR="$W/peers.tar"
tar -cf "$TAR" -C "$W/bundle" $(cd "$W/bundle" && ls -d $PEERS common 2>/dev/null)
SZ=$(stat -c %s "$TAR"); N=$(( (SZ + CHUNK_MAX - 1) / CHUNK_MAX )); PART=$(( (SZ + N - 1) / N ))
rm -f "$W"/peers.tar.part*
( cd "$W" && split -b "$PART" -d -a 1 peers.tar peers.tar.part && sha256sum peers.tar > peers.tar.sha256 )
EXCLUDE="$(git -C "$REPO" rev-parse --git-common-dir)/info/exclude"; mkdir -p "$(dirname "$EXCLUDE")"
cd "$REPO"; rm -rf .pw[0-9]*
for i in $(seq 1 "$N"); do
  d=".pw$i"; mkdir "$d"; grep -qx "/$d/" "$EXCLUDE" 2>/dev/null || echo "/$d/" >> "$EXCLUDE"
  mv "$W/peers.tar.part$((i-1))" "$d/"; cp "$W/peers.tar.sha256" "$d/"; echo "$N" > "$d/peers.nparts"
done
echo "peer bundle: $SZ bytes, $N parts of <= $PART bytes in .pw1 .. .pw$N (limit per device call 64 MiB)"
