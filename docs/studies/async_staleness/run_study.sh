#!/usr/bin/env bash
# max_staleness 0 vs 1 on the CPU demo (examples/math/math_selfplay_tiny.yaml), several seeds.
#   bash docs/studies/async_staleness/run_study.sh            # k 0 and 1, seeds 0 1 2: 6 runs at once
#   SEEDS="0 1" KS="0 1" PARALLEL=0 bash docs/studies/async_staleness/run_study.sh   # one at a time
# Each run gets CORES_PER_RUN cores of its own (taskset; run i on cores FIRST_CORE + i*CORES_PER_RUN ..),
# that many torch threads, no GPU, and its own local Ray (own temp dir). Output: $ROOT/k<K>_s<S>/
# (metrics.jsonl, checkpoints every 25 steps), its log $ROOT/k<K>_s<S>.log and $ROOT/k<K>_s<S>.wall
# (one "start end exit_code" line, epoch seconds, per invocation). TIMEOUT (seconds; 0, the default:
# none) stops every run; EXTRA adds overrides to every run. Calling the script again resumes each run
# from its last checkpoint (trainer.resume=auto), and a finished run just ends.
# OMP_WAIT_POLICY defaults to PASSIVE: with max_staleness >= 1 the rollout worker and the trainer compute
# at the same time on the run's cores, and OpenMP's default spin-waiting then makes every step ~12x slower
# (README.md here; roll_ma now sets it itself for CPU async runs). Then: python docs/studies/async_staleness/summarize.py $ROOT
set -uo pipefail
cd "$(dirname "$0")/../../.."
SEEDS=${SEEDS:-0 1 2} KS=${KS:-0 1} ROOT=${ROOT:-/tmp/study}
CORES_PER_RUN=${CORES_PER_RUN:-2} FIRST_CORE=${FIRST_CORE:-0} TIMEOUT=${TIMEOUT:-0} PARALLEL=${PARALLEL:-1}
PY=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
mkdir -p "$ROOT"

one() {  # one run: k, seed, first core
  local k=$1 s=$2 c=$3 name="k$1_s$2" t0 rc
  local cores=$c; [ "$CORES_PER_RUN" -gt 1 ] && cores="$c-$((c + CORES_PER_RUN - 1))"
  t0=$(date +%s)
  OMP_NUM_THREADS=$CORES_PER_RUN MKL_NUM_THREADS=$CORES_PER_RUN CUDA_VISIBLE_DEVICES="" \
    OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} \
    RAY_TMPDIR=/tmp/ray_$name timeout "$TIMEOUT" taskset -c "$cores" \
    "$PY" start_pipeline.py --config_name math_selfplay_tiny seed="$s" rollout.max_staleness="$k" \
    trainer.output_dir="$ROOT/$name" trainer.progress_bars=false ${EXTRA:-} >> "$ROOT/$name.log" 2>&1
  rc=$?
  echo "$t0 $(date +%s) $rc" >> "$ROOT/$name.wall"
  echo "[study] $name: exit $rc after $(($(date +%s) - t0)) s"
}

i=0
for k in $KS; do
  for s in $SEEDS; do
    c=$((FIRST_CORE + i * CORES_PER_RUN))
    if [ "$PARALLEL" = 1 ]; then one "$k" "$s" "$c" & sleep 3; else one "$k" "$s" "$FIRST_CORE"; fi
    i=$((i + 1))
  done
done
wait
