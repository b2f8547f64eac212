#!/usr/bin/env bash
# One device call (session 2, call 3): the rest of the H200 matrix after validate_and_measure.sh:
# speculative decoding on the shipped model, Qwen3-0.6B's ablation rows, long-context decode, the
# slow eager variants, and the peers.
#   run(command="bash bench/device_calls/matrix_rest.sh", carry=[".whl"], timeout_s=600)
# $OUT: probe.log, results.json / results.md (bench/results/NVIDIA-H200/), speculative_target.json, details.tgz
set -u
export PYTHONUNBUFFERED=1
source bench/device.sh setup || exit 1
D=/tmp/details; mkdir -p $D
R=bench/results/NVIDIA-H200
log() { echo "[$(date +%T)] $*" | tee -a $OUT/probe.log; }
quiet() { grep -vE "it/s|s/it|row/s|Warning|warn" "$@"; }
variants() { for v in "$@"; do echo --variant $v; done; }
log "speculative decoding on the shipped target"
timeout 60 python3 bench/speculative.py --device cuda --new-tokens 256 --repeats 3 --out $OUT/speculative_target.json \
  > $D/spec.log 2>&1; log "exit $?"; quiet $D/spec.log | tail -12 | tee -a $OUT/probe.log
log "matrix: Qwen3-0.6B"
timeout 150 python3 bench/run.py --shape Qwen3-0.6B --no-peers --seconds 0 --workload decode128_ctx1024 \
  --workload prefill1024 $(variants default no-pipelining tile-eager cublas-linears-eager no-fused-kernels \
  no-fused-kernels-no-pipelining unfused-eager no-cuda-graphs cublas-linears ngram) --out $R > $D/run06.log 2>&1
log "exit $?"; quiet $D/run06.log | tail -40 | tee -a $OUT/probe.log
log "long context"
timeout 80 python3 bench/run.py --shape Qwen3-4B --shape Qwen3-0.6B --no-peers --seconds 0 --workload decode128_ctx8192 \
  --workload decode128_ctx32768 $(variants default tile-eager) --out $R > $D/runlong.log 2>&1
log "exit $?"; quiet $D/runlong.log | tail -20 | tee -a $OUT/probe.log
log "slow eager variants"
timeout 110 python3 bench/run.py --shape Qwen3-4B --shape Qwen3-0.6B --no-peers --seconds 0 --workload decode128_ctx1024 \
  --workload prefill1024 $(variants reference unfused-refattn-eager int8 int8-kv) --out $R > $D/runslow.log 2>&1
log "exit $?"; quiet $D/runslow.log | tail -20 | tee -a $OUT/probe.log
log "peers: Qwen3-4B"
timeout 150 python3 bench/run.py --shape Qwen3-4B --seconds 0 --workload decode128_ctx1024 --workload prefill1024 \
  $(variants hf-sdpa engine-compiled hf-static-compile) --out $R > $D/runpeers.log 2>&1
log "exit $?"; quiet $D/runpeers.log | tail -30 | tee -a $OUT/probe.log
cp $R/results.json $R/results.md $R/results.png $OUT/ 2>/dev/null
tar czf $OUT/details.tgz -C /tmp details
