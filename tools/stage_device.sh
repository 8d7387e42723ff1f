#!/usr/bin/env bash
# Stage everything roll_ma's GPU runs need on the lent GPU machine (python 3.12, torch 2.11 preinstalled, no
# network), as ignored folders .wb1 .. .wbN that tools/device_install.sh installs, one part a device call:
#   - ../shared/device/stage_wheels.sh's bundle (SETS: vLLM, Ray, DeepSpeed, Hydra, tensordict, math-verify,
#     OpenSpiel with "spiel");
#   - every pin of pyproject's [vllm] extra that bundle lacks (liger-kernel 0.8.5 today), added to the last part:
#     device_install.sh installs every wheel it finds there. Without liger-kernel, model.liger_kernel=auto (the
#     default) runs the unfused update on a GPU and says so in one line, and a benchmark measures that path;
#   - with PEERS="trl verl openrlhf": the peers' wheels (.pw1 .. .pwM, benchmarks/peers/stage_peer_wheels.sh).
# From the repo root:  SETS="vllm rl proj" PEERS=trl bash tools/stage_device.sh
# It ends by listing the calls to make there; each part plus the working tree must stay under 64 MiB.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
SETS=${SETS:-"vllm rl spiel proj"}
PY=${PY:-python3}
LIMIT=$((64 * 1024 * 1024))
tree_bytes=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
# a part may fill what a call carries, less the tree and 2 MiB for the extra wheels the last part takes
CHUNK_MAX=${CHUNK_MAX:-$(( LIMIT - tree_bytes - 2 * 1024 * 1024 ))}
rm -rf .wb[0-9]*
SETS="$SETS" CHUNK_MAX=$CHUNK_MAX bash ../shared/device/stage_wheels.sh > /tmp/stage_device.log
n=$(ls -d .wb[0-9]* | wc -l)
last=".wb$n"

# the [vllm] extra's pins that the bundle does not hold (torch is the GPU image's; OpenSpiel only with "spiel")
skip="torch"; case " $SETS " in *" spiel "*) ;; *) skip="$skip open-spiel";; esac
bundled=$(tar -tf "${WORK:-/tmp/stagework}/bundle/wheels.tar" | sed 's#.*/##' | cut -d- -f1 | tr 'A-Z_' 'a-z-')
missing=$($PY - "$skip" "$bundled" <<'EOF'
import sys, tomllib
skip, bundled = set(sys.argv[1].split()), set(sys.argv[2].split())
for pin in tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["vllm"]:
    name = pin.split("==")[0].strip().lower().replace("_", "-")
    if name not in skip and name not in bundled:
        print(pin)
EOF
)
for pin in $missing; do
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 -d "$last" "$pin" 2>/dev/null \
    || { echo "no cp312 x86_64 wheel for $pin (pyproject's [vllm] extra)" >&2; exit 1; }
  echo "added $pin to $last"
done

if [ -n "${PEERS:-}" ]; then
  PEERS="$PEERS" CHUNK_MAX=$CHUNK_MAX bash benchmarks/peers/stage_peer_wheels.sh | tail -2
fi

parts=$(ls -d .wb[0-9]* | sort -V; [ -z "${PEERS:-}" ] || ls -d .pw[0-9]* | sort -V)  # an old .pwN: not this staging's
too_big=0
for d in $parts; do
  [ -d "$d" ] || continue
  b=$(du -cb "$d" | tail -1 | cut -f1)
  if [ $(( b + tree_bytes )) -gt $LIMIT ]; then echo "$d: $b bytes + the tree's $tree_bytes > 64 MiB" >&2; too_big=1; fi
done
[ $too_big = 0 ] || exit 1
echo "staged: $(echo $parts) (the tree: $tree_bytes bytes)"
echo "there, one call a part, back to back: carry .wbK and run 'source tools/device_install.sh' (the last one"
echo "installs everything), then for each .pwK: 'source tools/device_install.sh; bash benchmarks/peers/install_peer_wheels.sh'"
