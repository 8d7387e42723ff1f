#!/usr/bin/env bash
# On the lent GPU machine, from the repo root, once per call that carries a .pwN part (stage_peer_wheels.sh):
#   source tools/device_install.sh; bash benchmarks/peers/install_peer_wheels.sh
# Collects the parts into /tmp/peer_stage (kept while the machine stays warm); once all are there,
# reassembles and checks the tar and installs each peer's wheels into its own folder
# /tmp/peers/<peer>/site-packages (no deps, no index), which run_all.py --sites /tmp/peers puts first on that
# peer's PYTHONPATH only. The folder must be named site-packages: dill (datasets' fingerprint hash) pickles
# by value every module whose file is neither under sys.prefix nor in a site-packages folder, and pyarrow by
# value fails (PicklingError: Can't pickle <class 'MonthDayNano'>) in Dataset.from_list.
# Idempotent. PIP_FLAGS: extra pip flags (e.g. --python-version 3.12 --platform ... for a dry run elsewhere).
set -uo pipefail
STAGE=${STAGE:-/tmp/peer_stage}
SITES=${SITES:-/tmp/peers}
mkdir -p "$STAGE" "$SITES"
for d in .pw*; do [ -d "$d" ] && cp -n "$d"/* "$STAGE"/ 2>/dev/null; done
cd "$STAGE" || exit 1
if [ -f peers.nparts ]; then
  n=$(ls peers.tar.part* 2>/dev/null | wc -l); N=$(cat peers.nparts)
  if [ "$n" != "$N" ]; then echo "peer bundle: $n of $N parts present"; exit 0; fi
  cat $(ls peers.tar.part* | sort -V) > peers.tar && sha256sum -c --quiet peers.tar.sha256 \
    && tar -xf peers.tar && rm -f peers.tar peers.tar.part* peers.nparts && echo "peer bundle complete: $N parts"
fi
for peer in */; do
  peer=${peer%/}
  [ -e ".done.$peer" ] && [ -d "$SITES/$peer/site-packages" ] && continue
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade ${PIP_FLAGS:-} \
    --target "$SITES/$peer/site-packages" "$peer"/*.whl && touch ".done.$peer" \
    && echo "installed $peer into $SITES/$peer/site-packages"
done
