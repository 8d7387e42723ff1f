#!/usr/bin/env bash
# The GPU runs behind docs/benchmarks.md and docs/runs/, in parts that each fit one 10-minute
# device command (results under $OUT, at most 8 files per part). Staged here by tools/stage_device.sh (one
# .wbN part a call there, each `source tools/device_install.sh`). On the lent GPU machine:
#   source tools/device_install.sh; bash tools/gpu_campaign.sh tests|pipelines|multilora1|multilora2|extra|graphs
# (scaling7b / scaling7b_tp: the multi-GPU throughput sweep and a tensor-parallel engine, issue 25;
#  peers_start / peers_wait: the side-by-side job with TRL, verl and OpenRLHF on every GPU at once, issue 36)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
log() { echo "[$(date +%T)] $*"; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/machine.txt"
python -c "import torch, vllm, deepspeed, ray; print('torch', torch.__version__, 'vllm', vllm.__version__, 'deepspeed', deepspeed.__version__, 'ray', ray.__version__)" | tee -a "$OUT/machine.txt"

q05b() {  # a random Qwen2.5-0.5B-shaped model (no hub here), built once per machine
  [ -f /tmp/q05b/config.json ] || python -c "from roll_ma.models.tiny import build_tiny_model as b; \
b('/tmp/q05b', shape='qwen2.5-0.5b', vocab_size=151936, dtype='bfloat16')"
}

case "${1:-}" in
  tests)  # GPU tests (freshness, hf vs vllm, bf16 isolation), rollout throughput, adapter sync
    log "gpu tests"; python -m pytest -m gpu -s -q -p no:cacheprovider tests/training/test_gpu.py \
      tests/training/test_freshness_gpu.py tests/inference/test_vllm_gpu.py 2>&1 | tail -40 > "$OUT/gpu_tests.log"
    tail -5 "$OUT/gpu_tests.log"
    log "rollout throughput (vllm)"; timeout 240 python benchmarks/rollout_throughput.py --device cuda \
      --shape qwen2.5-0.5b --backends vllm --out "$OUT/rollout_throughput.json" > "$OUT/rollout_vllm.log" 2>&1
    tail -15 "$OUT/rollout_vllm.log"
    log "adapter sync"; timeout 180 python benchmarks/adapter_sync.py --device cuda --shape qwen2.5-0.5b \
      --out "$OUT/adapter_sync.json" > "$OUT/adapter_sync.log" 2>&1
    tail -15 "$OUT/adapter_sync.log" ;;
  pipelines)  # both self-play examples, 5 steps each, vLLM colocated with DeepSpeed (sleep level 1)
    q05b
    common="model.path=/tmp/q05b trainer.max_steps=5 trainer.eval_every=5 trainer.save_every=5 \
      rollout.max_new_tokens=32 rollout.enforce_eager=true rollout.gpu_memory_utilization=0.3"
    log "math_selfplay"; timeout 250 python start_pipeline.py --config_name math_selfplay $common \
      env.num_workers=1 env.groups_per_step=4 env.group_size=4 env.data.num_eval_problems=16 \
      trainer.output_dir=/tmp/runs/math_selfplay > "$OUT/math_selfplay.log" 2>&1
    cp /tmp/runs/math_selfplay/metrics.jsonl "$OUT/math_selfplay_metrics.jsonl"
    log "hanabi_selfplay"; timeout 235 python start_pipeline.py --config_name hanabi_selfplay $common \
      env.num_workers=1 env.groups_per_step=2 env.group_size=4 env.eval_episodes=4 env.max_turns=16 \
      trainer.output_dir=/tmp/runs/hanabi_selfplay > "$OUT/hanabi_selfplay.log" 2>&1
    cp /tmp/runs/hanabi_selfplay/metrics.jsonl "$OUT/hanabi_selfplay_metrics.jsonl"
    for f in math_selfplay hanabi_selfplay; do grep -E "^step|^ +[a-z_0-9]+: reward|eval:|done|Error|error" "$OUT/$f.log" | tail -12; done ;;
  multilora1)
    timeout 560 python benchmarks/multilora_cost.py --device cuda --levers baseline,default,targets \
      --out "$OUT/multilora_cost.json" > "$OUT/multilora1.log" 2>&1; tail -20 "$OUT/multilora1.log"
    cp "$OUT/multilora_cost.json" /tmp/multilora_cost.json ;;  # $OUT is emptied before the next command
  multilora2)
    [ -f /tmp/multilora_cost.json ] && cp /tmp/multilora_cost.json "$OUT/multilora_cost.json"
    timeout 560 python benchmarks/multilora_cost.py --device cuda --levers slots,targets+slots,specialize \
      --out "$OUT/multilora_cost.json" > "$OUT/multilora2.log" 2>&1; tail -20 "$OUT/multilora2.log" ;;
  extra)  # update cost of N agents vs 1, step time vs agents and batch, hf rollout
    log "train step"; timeout 150 python benchmarks/train_step.py --device cuda --shape qwen2.5-0.5b \
      --rows-per-agent 32 --prompt-len 256 --response-len 256 > "$OUT/train_step.log" 2>&1; tail -12 "$OUT/train_step.log"
    log "pipeline scaling"; timeout 240 python benchmarks/pipeline_scaling.py --device cuda --shape qwen2.5-0.5b \
      --agents 1,2,4,8 --skip-memory --out "$OUT/pipeline_scaling.json" > "$OUT/pipeline_scaling.log" 2>&1
    tail -15 "$OUT/pipeline_scaling.log"
    log "rollout throughput (hf)"; timeout 150 python benchmarks/rollout_throughput.py --device cuda \
      --shape qwen2.5-0.5b --backends hf --out "$OUT/rollout_throughput_hf.json" > "$OUT/rollout_hf.log" 2>&1
    tail -10 "$OUT/rollout_hf.log" ;;
  extra2)  # what 'extra' left open: step time vs agents and batch, HF rollout, adapter sync vs a full reload
    log "pipeline scaling"; timeout 230 python benchmarks/pipeline_scaling.py --device cuda --shape qwen2.5-0.5b \
      --agents 1,2,4,8 --batches 16,32,64 --steps 3 --repeats 1 --skip-memory --out "$OUT/pipeline_scaling.json" \
      > "$OUT/pipeline_scaling.log" 2>&1; tail -15 "$OUT/pipeline_scaling.log"
    log "rollout throughput (hf)"; timeout 120 python benchmarks/rollout_throughput.py --device cuda \
      --shape qwen2.5-0.5b --backends hf --repeats 1 --out "$OUT/rollout_throughput_hf.json" > "$OUT/rollout_hf.log" 2>&1
    tail -10 "$OUT/rollout_hf.log"
    log "adapter sync"; timeout 190 python benchmarks/adapter_sync.py --device cuda --shape qwen2.5-0.5b \
      --out "$OUT/adapter_sync.json" > "$OUT/adapter_sync.log" 2>&1; tail -15 "$OUT/adapter_sync.log" ;;
  x2_multilora)  # two GPUs: two chains of levers at once, one per GPU, merged into one table
    m=/tmp/roll_ma_random_qwen2.5-7b
    CUDA_VISIBLE_DEVICES=0 timeout 570 python benchmarks/multilora_cost.py --device cuda --budget-s 490 \
      --levers "${LEVERS0:-baseline,targets+slots,targets+slots+specialize}" --out "$OUT/ml_gpu0.json" > "$OUT/ml_gpu0.log" 2>&1 &
    while [ ! -f $m/.complete ] && kill -0 $! 2>/dev/null; do sleep 5; done  # the model is written once
    CUDA_VISIBLE_DEVICES=1 timeout 495 python benchmarks/multilora_cost.py --device cuda --budget-s 470 \
      --levers "${LEVERS1:-default,targets,targets+slots+graphs}" --out "$OUT/ml_gpu1.json" > "$OUT/ml_gpu1.log" 2>&1
    wait
    python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
a, b = (json.load(open(f"{out}/ml_gpu{i}.json")) for i in (0, 1))
a["levers"].update(b["levers"])
json.dump(a, open(f"{out}/multilora_cost.json", "w"), indent=1)
PY
    python benchmarks/multilora_cost.py --device cuda --levers "" --out "$OUT/multilora_cost.json" 2>&1 | tail -25 ;;
  x2_pipelines)  # math colocated on GPU 0 beside hanabi on GPU 1, then math split: rollout GPU 1, train GPU 0
    q05b
    common="model.path=/tmp/q05b trainer.max_steps=5 trainer.eval_every=5 trainer.save_every=5 \
      rollout.max_new_tokens=32 rollout.enforce_eager=true rollout.gpu_memory_utilization=0.3"
    math="env.num_workers=1 env.groups_per_step=4 env.group_size=4 env.data.num_eval_problems=16"
    log "math colocated (GPU 0) + hanabi (GPU 1)"
    CUDA_VISIBLE_DEVICES=0 timeout 300 python start_pipeline.py --config_name math_selfplay $common $math \
      trainer.output_dir=/tmp/runs/math_coloc > "$OUT/math_colocated.log" 2>&1 &
    CUDA_VISIBLE_DEVICES=1 timeout 330 python start_pipeline.py --config_name hanabi_selfplay $common \
      env.num_workers=1 env.groups_per_step=2 env.group_size=4 env.eval_episodes=4 env.max_turns=16 \
      trainer.output_dir=/tmp/runs/hanabi_selfplay > "$OUT/hanabi_selfplay.log" 2>&1
    wait
    log "math split: rollout on GPU 1, train + reference on GPU 0"
    timeout 230 python start_pipeline.py --config_name math_selfplay $common $math resources.num_gpus=2 \
      'resources.device_mapping={rollout:[1],train:[0]}' trainer.output_dir=/tmp/runs/math_split > "$OUT/math_split.log" 2>&1
    for r in math_coloc hanabi_selfplay math_split; do cp /tmp/runs/$r/metrics.jsonl "$OUT/${r}_metrics.jsonl"; done
    for f in math_colocated hanabi_selfplay math_split; do grep -E "^step|eval:|done|Error|error" "$OUT/$f.log" | tail -8; done ;;
  graphs)  # the agent sweep with vLLM's CUDA graphs (the shipped default); ~220 s per agent count
    # (compile + capture), so two calls on one warm machine: AGENTS=1,2 then AGENTS=4,8
    a=${AGENTS:-1,2}; log "pipeline scaling, CUDA graphs, agents $a"
    timeout 560 python benchmarks/pipeline_scaling.py --device cuda --shape qwen2.5-0.5b --agents "$a" \
      --batches 32 --steps 3 --repeats 1 --skip-memory --cuda-graphs \
      --out "$OUT/pipeline_scaling_graphs_${a//,/_}.json" > "$OUT/pipeline_scaling_graphs_${a//,/_}.log" 2>&1
    tail -20 "$OUT/pipeline_scaling_graphs_${a//,/_}.log" ;;
  smoke7b)  # the real-scale session's first part: build the random 7B once; the new paths on a 0.5B run
    log "random 7B"; (python -m roll_ma.models.random_weights Qwen/Qwen2.5-7B-Instruct > "$OUT/build7b.log" 2>&1 &)
    log "0.5B smoke: in-memory sync, token budgets, chunked head, replay"
    timeout 300 python benchmarks/pipeline_scaling.py --device cuda --shape qwen2.5-0.5b --agents 2 --batches 16 \
      --turns 2 --new-tokens 64 --steps 2 --eager --replay --skip-memory --out "$OUT/smoke.json" > "$OUT/smoke.log" 2>&1
    tail -14 "$OUT/smoke.log"; grep -E "Error|error" "$OUT/smoke.log" | grep -v "^\s*$" | head -5
    while pgrep -f roll_ma.models.random_weights > /dev/null; do sleep 3; done; tail -2 "$OUT/build7b.log"
    python -c "import glob; print(glob.glob('/root/.cache/roll_ma/random_models/*'))" ;;
  recorded7b)  # the shipped math_selfplay_7b at its size (3 agents, 64 episodes, 512 new tokens), random
    # weights; resumable: a second call finishes what the first could not in its 10 minutes
    mkdir -p /tmp/runs; (while sleep 10; do cp /tmp/runs/math7b/metrics.jsonl "$OUT/math7b_metrics.jsonl" 2>/dev/null; done &)
    timeout ${TIMEOUT:-560} python start_pipeline.py --config_name math_selfplay_7b model.random_weights=true \
      trainer.max_steps=${STEPS:-5} trainer.eval_every=0 trainer.save_every=1 trainer.progress_bars=false \
      trainer.output_dir=/tmp/runs/math7b >> /tmp/runs/math7b.log 2>&1
    cp /tmp/runs/math7b/metrics.jsonl "$OUT/math7b_metrics.jsonl"; cp /tmp/runs/math7b.log "$OUT/math7b.log"
    grep -E "^\[roll_ma\]|^step|Error" /tmp/runs/math7b.log | tail -20 ;;
  sweep7b)  # 1/2/4/8 agents at the 7B shape, same rows and tokens (the issue's 64 x 2 turns x 256 tokens)
    a=${AGENTS:-1,2}; m=$(python -m roll_ma.models.random_weights Qwen/Qwen2.5-7B-Instruct | tail -1)
    [ -f /tmp/sweep7b.json ] && cp /tmp/sweep7b.json "$OUT/sweep7b.json"
    log "sweep agents $a on $m"
    timeout ${TIMEOUT:-570} python benchmarks/pipeline_scaling.py --device cuda --model "$m" --agents "$a" \
      --batches 64 --turns 2 --new-tokens 256 --steps 3 --replay --skip-memory --out "$OUT/sweep7b.json" \
      --plot "$OUT/sweep7b.png" > "$OUT/sweep7b_${a//,/_}.log" 2>&1
    cp "$OUT/sweep7b.json" /tmp/sweep7b.json; tail -12 "$OUT/sweep7b_${a//,/_}.log" ;;
  async7b)  # issue 19: the asynchronous loop against the synchronous one at the 7B shape, same GPUs.
    # SPLIT=1 (nvidia-h200-x2): rollout on GPU 1, train on GPU 0; else one GPU, the engine awake (sleep 0)
    m=$(python -m roll_ma.models.random_weights Qwen/Qwen2.5-7B-Instruct | tail -1)
    if [ -n "${SPLIT:-}" ]; then lay="--split"; else lay="--sleep-level 0 --gpu-memory-utilization 0.4"; fi
    [ -f /tmp/async7b.json ] && cp /tmp/async7b.json "$OUT/async7b.json"  # earlier calls' runs on this machine
    for k in ${STALENESS:-0 1}; do
      log "async7b: max_staleness $k ($lay)"
      timeout ${TIMEOUT:-280} python benchmarks/pipeline_scaling.py --device cuda --model "$m" --agents ${AGENTS:-3} \
        --batches 64 --turns ${TURNS:-2} --new-tokens ${NEW_TOKENS:-256} --steps ${STEPS:-5} --max-staleness $k $lay ${EAGER:+--eager} --skip-memory \
        --out "$OUT/async7b.json" --timeline "$OUT/async7b_timeline.png" > "$OUT/async7b_k$k.log" 2>&1
      tail -6 "$OUT/async7b_k$k.log"; [ -f "$OUT/async7b.json" ] && cp "$OUT/async7b.json" /tmp/async7b.json
    done ;;
  scaling7b)  # issue 25: throughput vs GPUs at the 7B shape, fixed per-GPU work (64 episodes x 2 turns x
    # <= 256 new tokens per GPU; G engines and G train ranks colocated on G GPUs). One GPU count per call
    # (G engines start with CUDA graphs, ~4 min), all calls on ONE warm machine of one kind (the 1-GPU
    # point is the efficiency's base, so it runs there first): on nvidia-h200-x8 (or -x4 up to GPUS=4)
    #   GPUS=1 bash tools/gpu_campaign.sh scaling7b; then GPUS=2, GPUS=4, GPUS=8; AGENTS=1 likewise
    g=${GPUS:-1}; a=${AGENTS:-8}; m=$(python -m roll_ma.models.random_weights Qwen/Qwen2.5-7B-Instruct | tail -1)
    nvidia-smi topo -m > "$OUT/topology.txt" 2>&1
    [ -f /tmp/scaling7b.json ] && cp /tmp/scaling7b.json "$OUT/scaling7b.json"
    log "throughput sweep: $g GPU(s), $a agent(s) on $m"
    timeout ${TIMEOUT:-570} python benchmarks/pipeline_scaling.py --device cuda --model "$m" --agents "$a" \
      --gpus "$g" --batches 64 --turns 2 --new-tokens 256 --steps 3 --skip-memory --out "$OUT/scaling7b.json" \
      --plot "$OUT/scaling7b.png" > "$OUT/scaling7b_${g}gpu_${a}agents.log" 2>&1
    cp "$OUT/scaling7b.json" /tmp/scaling7b.json; tail -14 "$OUT/scaling7b_${g}gpu_${a}agents.log" ;;
  scaling7b_tp)  # issue 25: one engine over 2 GPUs (rollout.tensor_parallel=2) beside one train GPU, 7B
    # shape, to check the TP engine and the adapter install on both shards (nvidia-h200-x4 or larger)
    m=$(python -m roll_ma.models.random_weights Qwen/Qwen2.5-7B-Instruct | tail -1)
    timeout ${TIMEOUT:-570} python start_pipeline.py --config_name math_selfplay_7b model.path="$m" \
      rollout.tensor_parallel=2 resources.num_gpus=3 'resources.device_mapping={train:[0],rollout:[1,2]}' \
      rollout.gpu_memory_utilization=0.85 trainer.max_steps=3 trainer.eval_every=0 trainer.save_every=0 \
      trainer.progress_bars=false trainer.output_dir=/tmp/runs/tp2 > "$OUT/tp2.log" 2>&1
    cp /tmp/runs/tp2/metrics.jsonl "$OUT/tp2_metrics.jsonl"; grep -E "^\[roll_ma\]|^step|Error" "$OUT/tp2.log" | tail -12 ;;
  mfu7b)  # issue 31: MFU of the scoring passes and the update at the 7B shape, trainer only (no engine, no Ray);
    # two GPUs: two sets of variants at once (VARIANTS0 on GPU 0, VARIANTS1 on GPU 1), the GPU tests beside them
    m=$(python -m roll_ma.models.random_weights Qwen/Qwen2.5-7B-Instruct | tail -1)
    a="--device cuda --model $m --rows ${ROWS:-16} --prompt-lens 100,2048,2048 --response-len 512 --repeats 2"
    CUDA_VISIBLE_DEVICES=0 timeout ${TIMEOUT:-420} python benchmarks/train_mfu.py $a --variants "${VARIANTS0:-padded,packed}" \
      --profile packed --out "$OUT/mfu_gpu0.json" > "$OUT/mfu_gpu0.log" 2>&1 &
    if [ "$(nvidia-smi -L | wc -l)" -gt 1 ]; then
      CUDA_VISIBLE_DEVICES=1 timeout ${TIMEOUT:-420} python benchmarks/train_mfu.py $a \
        --variants "${VARIANTS1:-packed_nockpt_8k,padded_nockpt_8k,packed_big}" --out "$OUT/mfu_gpu1.json" > "$OUT/mfu_gpu1.log" 2>&1
    fi
    wait
    CUDA_VISIBLE_DEVICES=0 python -m pytest -q -m gpu -p no:cacheprovider tests/models/test_varlen_attention.py 2>&1 | tail -3
    for f in "$OUT"/mfu_gpu*.log; do grep -E "^\||^- |JSON|Error|error" "$f" | tail -14; done ;;
  step7b)  # issue 31: the shipped math_selfplay_7b before (the tree in .before/, GPU 0) and now (GPU 1), at once
    m=$(python -m roll_ma.models.random_weights Qwen/Qwen2.5-7B-Instruct | tail -1)
    common="model.random_weights=true trainer.max_steps=${STEPS:-4} trainer.eval_every=0 trainer.save_every=0 trainer.progress_bars=false"
    (cd .before && CUDA_VISIBLE_DEVICES=0 PYTHONPATH=$PWD:$PYTHONPATH timeout ${TIMEOUT:-570} python start_pipeline.py \
      --config_name math_selfplay_7b $common trainer.output_dir=/tmp/runs/before > "$OUT/before.log" 2>&1) &
    CUDA_VISIBLE_DEVICES=1 timeout ${TIMEOUT:-570} python start_pipeline.py --config_name math_selfplay_7b $common \
      ${AFTER:-} trainer.output_dir=/tmp/runs/after > "$OUT/after.log" 2>&1
    wait
    for r in before after; do cp /tmp/runs/$r/metrics.jsonl "$OUT/${r}_metrics.jsonl" 2>/dev/null; \
      grep -E "^step|Error|error" "$OUT/$r.log" | tail -6; done ;;
  redesign7b)  # roll_ma's 7B step before a change (the tree in .before/: `chains` says how to make it) and after
    # (this tree), each on a GPU of its own (SWAP=1: before on GPU 1): the peers job's roll_ma row (AGENTS,
    # default N = 1 and 3, 7 steps each) on one random 7B, in the background, as two `chains`; then
    # `WAIT=540 bash tools/gpu_campaign.sh redesign7b_wait` (a call each) until both are done. Issues 39, 48.
    [ -s /tmp/peers_model_path ] || python -m roll_ma.models.random_weights Qwen/Qwen2.5-7B-Instruct \
      --dtype bfloat16 --seed 0 2>&1 | tail -1 > /tmp/peers_model_path
    b=0; a=1; [ "${SWAP:-0}" = 1 ] && { b=1; a=0; }
    env "CHAIN$b=before:${AGENTS:-1,3}" "CHAIN$a=after:${AGENTS:-1,3}" bash "$0" chains ;;
  redesign7b_wait)  # the two sides' tables and logs to $OUT (before_peers.*, after_peers.*)
    bash "$0" chains_wait ;;
  peers_model)  # the job's random 7B, built in the background (a call that carries a .pwN part can start it);
    # peers_start waits for its path in /tmp/peers_model_path
    rm -f /tmp/peers_model_path
    setsid nohup bash -c "python -m roll_ma.models.random_weights Qwen/Qwen2.5-7B-Instruct --dtype bfloat16 \
      --seed 0 > /tmp/peers_model.log 2>&1 && tail -1 /tmp/peers_model.log > /tmp/peers_model_path.tmp \
      && mv /tmp/peers_model_path.tmp /tmp/peers_model_path" < /dev/null > /dev/null 2>&1 &
    log "building the random 7B in the background (/tmp/peers_model.log)" ;;
  peers_start)  # issue 36: the whole side-by-side table on one machine, every GPU at once, in the background
    # (a 4-GPU kind: ~15 runs of 7 steps, one per GPU at a time). Peer wheels: stage_peer_wheels.sh here, one
    # .pwN part per call there (install_peer_wheels.sh), the last call runs this. The run outlives the call:
    # it runs from a copy of the tree in its own process session; `peers_wait` reads it.
    bash benchmarks/peers/install_peer_wheels.sh
    if [ -z "${MODEL:-}" ] && [ -f /tmp/peers_model.log ]; then  # peers_model's build: wait for its path
      for _ in $(seq 120); do [ -f /tmp/peers_model_path ] && break; sleep 2; done
      MODEL=$(cat /tmp/peers_model_path 2>/dev/null); log "model: ${MODEL:-not built, see /tmp/peers_model.log}"
    fi
    rm -rf /tmp/w && mkdir -p /tmp/w /tmp/peers_out && tar --exclude='./.wb*' --exclude='./.pw*' -cf - . | tar -xf - -C /tmp/w
    GPUS=${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd,)}
    setsid nohup bash -c "cd /tmp/w && PYTHONPATH=/tmp/w:$PYTHONPATH timeout ${TOTAL:-1500} python \
      benchmarks/peers/run_all.py --sites /tmp/peers --out-dir /tmp/peers_out --gpus $GPUS ${MODEL:+--model $MODEL} \
      --rows '${FW:-roll_ma,roll_ma_unfused@1,trl,trl_best,verl,openrlhf@1,trl_is@1}' --timeout ${RUN_TIMEOUT:-900}; \
      echo DONE" \
      > /tmp/peers_out/run_all.log 2>&1 < /dev/null &
    sleep 5; log "started run_all on GPUs $GPUS"; tail -3 /tmp/peers_out/run_all.log ;;
  peers_wait)  # wait up to WAIT s for the background run_all, then the table so far and every log to $OUT
    end=$(( $(date +%s) + ${WAIT:-540} ))
    # the table so far goes to $OUT every 10 s: a call cut short by the device budget still returns it
    while [ "$(date +%s)" -lt "$end" ] && ! grep -q '^DONE' /tmp/peers_out/run_all.log 2>/dev/null; do
      cp /tmp/peers_out/peers.json /tmp/peers_out/peers.md /tmp/peers_out/run_all.log "$OUT"/ 2>/dev/null; sleep 10
    done
    grep '\[run_all\]' /tmp/peers_out/run_all.log | tail -40; cat /tmp/peers_out/peers.md 2>/dev/null
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
    cp /tmp/peers_out/peers.json /tmp/peers_out/peers.md /tmp/peers_out/run_all.log "$OUT"/ 2>/dev/null
    tar -czf "$OUT/peer_logs.tgz" -C /tmp/peers_out $(cd /tmp/peers_out && ls *.log) 2>/dev/null ;;
  peers45)  # issue 45: the fair table on one machine, every GPU at once, in the background. PLAN is a list of
    # run_all invocations run one after another, each "JOB|ROWS|AGENTS|REPEATS[|GPUS][&]" (JOB: job.yaml or
    # relay.yaml; GPUS: this item's GPUs, default all; a trailing & starts the next item beside this one,
    # e.g. two one-GPU items at once); all of them write one table (/tmp/p45/peers.json per job).
    # The random 7B is built first (peers_model).
    bash benchmarks/peers/install_peer_wheels.sh
    for _ in $(seq 150); do [ -f /tmp/peers_model_path ] && break; sleep 2; done
    MODEL=$(cat /tmp/peers_model_path 2>/dev/null); log "model: ${MODEL:-not built, see /tmp/peers_model.log}"
    rm -rf /tmp/w && mkdir -p /tmp/w /tmp/p45 && tar --exclude='./.wb*' --exclude='./.pw*' --exclude='./.whl' -cf - . | tar -xf - -C /tmp/w
    GPUS=${GPUS:-$(nvidia-smi --query-gpu=index --format=csv,noheader | paste -sd,)}
    script=/tmp/p45/plan.sh; echo "cd /tmp/w" > $script
    for item in ${PLAN:-"relay.yaml|roll_ma,trl_best|8|1|0&" "job.yaml|verl_best,trl_best_sleep|1|1|1" "job.yaml|roll_ma,roll_ma_prefix|1,3|1" "job.yaml|roll_ma,trl_best|8|1" "job.yaml|openrlhf|1|1"}; do
      amp=""; [ "${item: -1}" = "&" ] && { amp=" &"; item=${item%&}; }
      IFS='|' read -r job rows agents repeats gpus <<< "$item"
      echo "PYTHONPATH=/tmp/w:$PYTHONPATH python benchmarks/peers/run_all.py --sites /tmp/peers --gpus ${gpus:-$GPUS} \
        --model $MODEL --job benchmarks/peers/$job --rows $rows --agents $agents --repeats $repeats \
        --out-dir /tmp/p45/${job%.yaml} --timeout ${RUN_TIMEOUT:-720}$amp" >> $script
    done
    echo "wait; echo DONE" >> $script
    setsid nohup bash -c "timeout ${TOTAL:-1700} bash $script" > /tmp/p45/run_all.log 2>&1 < /dev/null &
    sleep 5; log "started the plan on GPUs $GPUS"; cat $script | grep -o -- "--gpus [0-9,]*\|--job.*--repeats [0-9]*" ;;
  peers45_wait)  # wait up to WAIT s for the plan (or for the file STOP_WHEN names), then the tables and logs to $OUT
    end=$(( $(date +%s) + ${WAIT:-540} ))
    while [ "$(date +%s)" -lt "$end" ] && ! grep -q '^DONE' /tmp/p45/run_all.log 2>/dev/null; do
      for j in job relay; do cp /tmp/p45/$j/peers.json "$OUT/${j}_peers.json" 2>/dev/null; cp /tmp/p45/$j/peers.md "$OUT/${j}_peers.md" 2>/dev/null; done
      sleep 10
    done
    grep '\[run_all\]' /tmp/p45/run_all.log | grep -v " on GPU " | tail -30
    for j in job relay; do cat /tmp/p45/$j/peers.md 2>/dev/null | head -30; cp /tmp/p45/$j/peers.json "$OUT/${j}_peers.json" 2>/dev/null; cp /tmp/p45/$j/peers.md "$OUT/${j}_peers.md" 2>/dev/null; done
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
    tar -czf "$OUT/p45_logs.tgz" -C /tmp/p45 $(cd /tmp/p45 && ls -d */*.log run_all.log 2>/dev/null) 2>/dev/null ;;
  chains)  # issues 45, 48: one queue of runs per GPU, each in the background, its items one after another on
    # that GPU. CHAIN0="item item ..." CHAIN1=... (CHAIN<g> for GPU g); an item: gpu_tests (pytest -m gpu;
    # gpu_test:<path> the GPU tests of one file or folder), math7b (the shipped math_selfplay_7b, 4 steps; math7b:before
    # the tree in .before/, math7b+key=value+... with overrides),
    # decode (benchmarks/decode_floor.py on math_selfplay_7b's engine: decode against the bandwidth floor),
    # mfu (benchmarks/train_mfu.py at the job's shape, with a profile of the update),
    # before:AGENTS / after:AGENTS (the peers job's roll_ma row from the tree in .before/ or this tree, issue 48's
    # 7B step before and after), or JOB|ROWS|AGENTS|REPEATS (a run_all item as in peers45; peer rows wait
    # for install_peer_wheels.sh to finish in a later call). Every chain but GPU 0's starts 45 s
    # later, and an item that starts Ray (roll_ma, verl, OpenRLHF, math7b) waits until 40 s after the last such
    # start on any GPU (two local Ray instances started at once can hang). Results: /tmp/ch/g<g>/<job>_<k>/ (the chain's k-th item) and /tmp/ch/<side>/, each item's exit
    # code in /tmp/ch/progress.log; read back with `WAIT=540 bash tools/gpu_campaign.sh chains_wait` (a call each,
    # until every chain is done). Needs: the random 7B (`peers_model` in an earlier call; this waits up to
    # 300 s for it), for before: items the old tree in .before/ (`mkdir .before && git archive <commit> roll_ma
    # benchmarks tools examples pyproject.toml setup.py start_pipeline.py | tar -x -C .before`, carried), for
    # peer rows their wheels (install_peer_wheels.sh; an item waits for them). TOTAL: seconds a chain may run
    # (1700; 1380 leaves a two-GPU lease time to read the results back); RUN_TIMEOUT: seconds per runner
    # process (720). Between two calls the machine goes back after 30 s idle: send them back to back.
    # With no CHAIN<g> given: what issue 45 still lacks (N = 1 and N = 3 have three repeats of both rows on one
    # machine, 2026-11-28/29; N = 8 roll_ma twice and TRL once, relay at N = 8 once, 2026-11-29): N = 8, roll_ma's
    # defaults and TRL at its best, three repeats each on one machine, and relay at N = 8. Two GPUs hold that
    # in ~26 minutes (TRL's eight runs take ~11, roll_ma's one ~4, relay ~6); a third GPU runs OpenRLHF.
    # One GPU cannot hold three of each in 30 minutes: it runs roll_ma, TRL, roll_ma and relay at N = 8
    # (~25 minutes), a ratio of two repeats against one. Send every call back to back.
    # Merge the tables with benchmarks/peers/merge_tables.py.
    if [ -z "$(compgen -v CHAIN)" ]; then
      r8="job.yaml|roll_ma|8|1" t8="job.yaml|trl_best|8|1"
      if [ "$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)" -lt 2 ]; then
        CHAIN0="$r8 $t8 $r8 relay.yaml|roll_ma|8|1"
      else
        CHAIN0="$t8 $r8 $t8"
        CHAIN1="$r8 $t8 $r8 relay.yaml|roll_ma|8|1"
        CHAIN2="job.yaml|openrlhf|1|1"
      fi
    fi
    for _ in $(seq 150); do [ -f /tmp/peers_model_path ] && break; sleep 2; done
    MODEL=$(cat /tmp/peers_model_path 2>/dev/null)
    [ -n "$MODEL" ] || { log "no model: run 'bash tools/gpu_campaign.sh peers_model' first (/tmp/peers_model.log)"; exit 1; }
    log "model: $MODEL"
    # roll_ma's GPU default (model.liger_kernel=auto) runs unfused without liger-kernel: refuse to measure that
    python -c "import liger_kernel" 2>/dev/null || [ -n "${NO_LIGER_OK:-}" ] || {
      log "liger-kernel is not installed here (tools/stage_device.sh puts it in the last .wbN part); NO_LIGER_OK=1 runs anyway"; exit 1; }
    if [ ! -d .before ]; then
      for var in ${!CHAIN*}; do case " ${!var} " in *" before:"*|*" math7b:before"*) log "$var has a before: item and there is no .before/"; exit 1;; esac; done
    fi
    rm -rf /tmp/w_after /tmp/w_before /tmp/ch && mkdir -p /tmp/w_after /tmp/ch
    tar --exclude='./.wb*' --exclude='./.pw*' --exclude='./.whl' --exclude='./.before' -cf - . | tar -xf - -C /tmp/w_after
    [ -d .before ] && cp -r .before /tmp/w_before
    first=1
    for g in $(nvidia-smi --query-gpu=index --format=csv,noheader); do
      var=CHAIN$g; [ -n "${!var:-}" ] || continue
      script=/tmp/ch/chain$g.sh; echo "set -u" > $script
      [ $first = 1 ] || echo "sleep 45" >> $script; first=0
      k=0
      for item in ${!var}; do
        k=$((k + 1))  # each item its own out-dir: an item repeated later in the chain adds runs, replaces none
        case "$item" in  # a peer's rows wait for its wheels (install_peer_wheels.sh, a later call)
          *"|"*) rows=$(echo "$item" | cut -d'|' -f2)
            # (the AT-GRPO port, atgrpo_*, runs on verl's wheels)
            for fw in $(echo "$rows" | tr ',' '\n' | cut -d@ -f1 | cut -d_ -f1 | grep -v '^roll' | sed 's/^atgrpo$/verl/' | sort -u); do
              echo "while [ ! -e /tmp/peer_stage/.done.$fw ]; do sleep 5; done" >> $script
            done ;;
        esac
        case "$item" in  # then a run that starts Ray waits until 40 s after the last such start on any GPU
          math7b*|before:*|after:*|*roll_ma*|*verl*|*openrlhf*|*atgrpo*) echo "flock /tmp/ch/start.lock bash -c 'w=\$(( \$(cat /tmp/ch/last_start \
            2>/dev/null || echo 0) + 40 - \$(date +%s) )); [ \$w -gt 0 ] && sleep \$w; date +%s > /tmp/ch/last_start'" >> $script ;;
        esac
        case "$item" in
          gpu_tests|gpu_test:*) what=tests; [ "$item" = gpu_tests ] || what=${item#gpu_test:}
            echo "cd /tmp/w_after && CUDA_VISIBLE_DEVICES=$g PYTHONPATH=/tmp/w_after:$PYTHONPATH timeout 480 \
            python -m pytest -m gpu -q -p no:cacheprovider -p no:randomly $what >> /tmp/ch/gpu_tests.log 2>&1" >> $script ;;
          math7b*)  # the shipped math_selfplay_7b on the job's random 7B, 4 steps (median of steps 2-4);
            # math7b:before runs the tree in .before/, math7b+key=value+... adds overrides (a lever on, issue 59)
            spec=${item#math7b}; side=after; case "$spec" in :before*) side=before; spec=${spec#:before};; esac
            echo "cd /tmp/w_$side && CUDA_VISIBLE_DEVICES=$g PYTHONPATH=/tmp/w_$side:$PYTHONPATH timeout 720 \
            python start_pipeline.py --config_name math_selfplay_7b model.path=$MODEL trainer.max_steps=4 \
            trainer.eval_every=0 trainer.save_every=0 trainer.progress_bars=false \
            trainer.output_dir=/tmp/ch/math7b_$k ${spec//+/ } > /tmp/ch/math7b_$k.log 2>&1" >> $script ;;
          decode)  # issue 59: the 7B job's engine, ms a decode step against the bandwidth floor, no adapter / one /
            # every agent's, a plain engine, a profile of a step (benchmarks/decode_floor.py); the job file's settings
            echo "cd /tmp/w_after && CUDA_VISIBLE_DEVICES=$g PYTHONPATH=/tmp/w_after:$PYTHONPATH timeout 560 \
            python benchmarks/decode_floor.py --config math_selfplay_7b model.path=$MODEL --device cuda \
            --contexts ${DECODE_CONTEXTS:-160,2048} --new-tokens 256 --profile --budget-s 420 \
            --out /tmp/ch/decode.json > /tmp/ch/decode.log 2>&1" >> $script ;;
          mfu)  # the update's MFU and a profile of it at the job's shape and the roll_ma row's settings
            echo "cd /tmp/w_after && CUDA_VISIBLE_DEVICES=$g PYTHONPATH=/tmp/w_after:$PYTHONPATH timeout 480 \
            python benchmarks/train_mfu.py --device cuda --model $MODEL --agents 1 --rows 192 --group-size 8 \
            --prompt-lens 136 --response-len 256 --variants packed_nockpt_8k,shared_nockpt_8k --repeats 2 \
            --profile shared_nockpt_8k --out /tmp/ch/mfu.json > /tmp/ch/mfu.log 2>&1" >> $script ;;
          before:*|after:*) side=${item%%:*}
            echo "cd /tmp/w_$side && PYTHONPATH=/tmp/w_$side:$PYTHONPATH python benchmarks/peers/run_all.py \
              --out-dir /tmp/ch/$side --gpus $g --model $MODEL --rows roll_ma --agents ${item#*:} --repeats 1 \
              --timeout ${RUN_TIMEOUT:-720} > /tmp/ch/$side.log 2>&1" >> $script ;;
          *) IFS='|' read -r job rows agents repeats <<< "$item"
            echo "cd /tmp/w_after && PYTHONPATH=/tmp/w_after:$PYTHONPATH python benchmarks/peers/run_all.py --sites /tmp/peers \
              --gpus $g --model $MODEL --job benchmarks/peers/$job --rows $rows --agents $agents --repeats $repeats \
              --out-dir /tmp/ch/g$g/${job%.yaml}_$k --timeout ${RUN_TIMEOUT:-720} >> /tmp/ch/g$g.log 2>&1" >> $script ;;
        esac
        echo "rc=\$?; echo \"[\$(date +%T)] chain $g: $item done, exit \$rc\" >> /tmp/ch/progress.log" >> $script
      done
      echo "echo DONE >> /tmp/ch/chain$g.done" >> $script
      setsid nohup bash -c "timeout ${TOTAL:-1700} bash $script" > /tmp/ch/chain$g.log 2>&1 < /dev/null &
      log "chain $g: ${!var}"
    done ;;
  chains_wait)  # wait up to WAIT s for every chain (copying what is there to $OUT every 10 s), then the tables.
    # Every item's table goes into one tables.tgz (<g><job>_<k>_peers.json/.md: GPU, job, the chain's k-th
    # item), so a call returns at most 8 files however many items ran: tar -xzf tables.tgz here
    end=$(( $(date +%s) + ${WAIT:-540} )); n=$(ls /tmp/ch/chain*.sh | wc -l)
    copy() {
      cp /tmp/ch/progress.log /tmp/ch/gpu_tests.log /tmp/ch/mfu.json /tmp/ch/mfu.log \
        /tmp/ch/decode.json /tmp/ch/decode.log "$OUT"/ 2>/dev/null
      # every math7b item's log and metrics in one math7b.tgz (math7b_<k>.log, math7b_<k>/metrics.jsonl)
      (cd /tmp/ch && ls math7b_*.log >/dev/null 2>&1 && tar -czf "$OUT/math7b.tgz.tmp" math7b_*.log \
        $(ls math7b_*/metrics.jsonl 2>/dev/null) && mv "$OUT/math7b.tgz.tmp" "$OUT/math7b.tgz")
      mkdir -p /tmp/ch/tables
      for d in /tmp/ch/before /tmp/ch/after /tmp/ch/g*/*/; do [ -f $d/peers.json ] || continue
        tag=$(echo ${d#/tmp/ch/} | tr -d / ); cp $d/peers.json /tmp/ch/tables/${tag}_peers.json; cp $d/peers.md /tmp/ch/tables/${tag}_peers.md; done
      [ -n "$(ls /tmp/ch/tables)" ] && tar -czf "$OUT/tables.tgz.tmp" -C /tmp/ch/tables . && mv "$OUT/tables.tgz.tmp" "$OUT/tables.tgz"
    }
    while [ "$(date +%s)" -lt "$end" ] && [ "$(cat /tmp/ch/chain*.done 2>/dev/null | wc -l)" -lt "$n" ]; do copy; sleep 10; done
    copy; cat /tmp/ch/progress.log; tail -3 /tmp/ch/gpu_tests.log 2>/dev/null; grep -E "^\| (lora|plain|profile) " /tmp/ch/decode.log 2>/dev/null
    for f in /tmp/ch/tables/*_peers.md; do [ -f "$f" ] || continue; echo "== ${f##*/}"; grep '^| ' "$f" | head -12; done
    nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
    tar -czf "$OUT/ch_logs.tgz" -C /tmp/ch $(cd /tmp/ch && ls -d *.log */*.log */*/*.log 2>/dev/null) 2>/dev/null ;;
  *) echo "usage: $0 tests|pipelines|multilora1|multilora2|extra|extra2|x2_multilora|x2_pipelines|graphs|smoke7b|recorded7b|sweep7b|async7b|scaling7b|scaling7b_tp|mfu7b|step7b|redesign7b|redesign7b_wait|peers_start|peers_wait|peers45|peers45_wait|chains|chains_wait"; exit 2 ;;
esac
