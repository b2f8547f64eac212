#!/usr/bin/env bash
# One device call (session 3, call 3): the engine's final default (RMSNorm kernel + GEMV with
# SwiGLU / residual epilogues; one attention-input kernel): engine GPU tests, the CUDA-graph table
# rows with the norm-prologue variant beside them, prefill against cuBLAS, the long-context
# columns of the graph variants, 0.6B int8-kv.
#   run(command="COMMIT=$(git rev-parse --short HEAD) bash bench/device_calls/final_rows.sh", carry=[".whl"])
source bench/device_calls/common.sh
log "GPU tests: engine, plugins"
timeout 90 python3 -m pytest -q -p no:cacheprovider -m gpu tests/core tests/plugins > $D/pytest.log 2>&1
log "pytest exit $?"; grep -E "^(FAILED|ERROR)| passed| failed" $D/pytest.log | tail -20 | tee -a $OUT/probe.log
log "decode rows, both shapes"
timeout 110 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-4B --shape Qwen3-0.6B --no-peers --seconds 0 \
  --workload decode128_ctx1024 $(variants default norm-prologue no-pipelining tile-eager no-fused-kernels \
  no-fused-kernels-no-pipelining unfused-eager cublas-linears) --out $R > $D/run.log 2>&1
log "run.py exit $?"; quiet $D/run.log | grep -B2 -A24 "### Ablation" | tee -a $OUT/probe.log
log "prefill"
timeout 50 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-4B --shape Qwen3-0.6B --no-peers --seconds 0 \
  --workload prefill1024 $(variants default cublas-linears tile-eager) --out $R > $D/run_prefill.log 2>&1
log "run.py exit $?"; quiet $D/run_prefill.log | grep -A6 "### Ablation" | tee -a $OUT/probe.log
log "long context"
timeout 280 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-4B --shape Qwen3-0.6B --no-peers --seconds 0 \
  --workload decode128_ctx8192 --workload decode128_ctx32768 $(variants default no-pipelining no-fused-kernels \
  cublas-linears tile-eager ngram) --out $R > $D/runlong.log 2>&1
log "run.py exit $?"; quiet $D/runlong.log | grep -A12 "### Summary" | tee -a $OUT/probe.log
log "0.6B int8-kv"
timeout 45 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-0.6B --no-peers --seconds 0 \
  --workload decode128_ctx1024 --workload prefill1024 --variant int8-kv --out $R > $D/runint8kv.log 2>&1
log "exit $?"
cp $R/results.json $R/results.md $R/results.png $OUT/ 2>/dev/null
tar czf $OUT/details.tgz -C /tmp details
