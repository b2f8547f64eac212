#!/usr/bin/env bash
# One device call (session 2, call 3): the rest of the H200 matrix after validate_and_measure.sh:
# speculative decoding on the shipped model, Qwen3-0.6B's ablation rows, the 4B reference-point rows
# again with several samples each, long-context decode, the slow eager variants, the peers, and the
# GPU tests of the steps (graphs captured when the engine is built).
#   run(command="bash bench/device_calls/matrix_rest.sh", carry=[".whl"], timeout_s=600)
# $OUT: probe.log, results.json / results.md / results.png (bench/results/NVIDIA-H200/),
#       speculative_target.json, details.tgz
source bench/device_calls/common.sh
FAST="default no-pipelining tile-eager cublas-linears-eager no-fused-kernels no-fused-kernels-no-pipelining unfused-eager no-cuda-graphs cublas-linears ngram"
log "speculative decoding on the shipped target"
timeout 50 python3 bench/speculative.py --device cuda --new-tokens 256 --repeats 2 --out $OUT/speculative_target.json \
  > $D/spec.log 2>&1; log "exit $?"; quiet $D/spec.log | tail -11 | tee -a $OUT/probe.log
log "matrix: Qwen3-0.6B"
timeout 120 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-0.6B --no-peers --seconds 0.5 --workload decode128_ctx1024 \
  --workload prefill1024 $(variants $FAST) --out $R > $D/run06.log 2>&1
log "exit $?"
log "matrix: Qwen3-4B, several samples a row"
timeout 60 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-4B --no-peers --seconds 1 --workload decode128_ctx1024 \
  --workload prefill1024 $(variants default no-pipelining tile-eager cublas-linears-eager cublas-linears ngram) \
  --out $R > $D/run4.log 2>&1
log "exit $?"
log "long context"
timeout 70 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-4B --shape Qwen3-0.6B --no-peers --seconds 0 --workload decode128_ctx8192 \
  --workload decode128_ctx32768 $(variants default tile-eager) --out $R > $D/runlong.log 2>&1
log "exit $?"
log "slow eager variants: Qwen3-4B"
timeout 70 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-4B --no-peers --seconds 0 --workload decode128_ctx1024 \
  --workload prefill1024 $(variants reference unfused-refattn-eager int8 int8-kv) --out $R > $D/runslow.log 2>&1
log "exit $?"
log "peers: Qwen3-4B"
timeout 120 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-4B --seconds 0 --workload decode128_ctx1024 --workload prefill1024 \
  $(variants hf-sdpa engine-compiled hf-static-compile) --out $R > $D/runpeers.log 2>&1
log "exit $?"; quiet $D/runpeers.log | tail -75 | tee -a $OUT/probe.log
log "GPU tests of the steps"
timeout 50 python3 -m pytest -q -p no:cacheprovider -m gpu tests/core/test_steps.py tests/core/test_pipelined.py \
  > $D/pytest.log 2>&1; log "pytest exit $?"; tail -3 $D/pytest.log | tee -a $OUT/probe.log
cp $R/results.json $R/results.md $R/results.png $OUT/ 2>/dev/null
tar czf $OUT/details.tgz -C /tmp details
