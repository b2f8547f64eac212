#!/usr/bin/env bash
# A device call prepared for the next session (not run yet): the long-context columns of the
# H200 matrix for the variants that can hold 32k positions, the peers after 8k, and 0.6B int8-kv.
# The reference attention (and so int8-kv, reference, unfused-refattn-eager) materializes the
# scores in float32 and runs out of memory at 32k: those rows record the reason.
#   run(command="COMMIT=$(git rev-parse --short HEAD) bash bench/device_calls/long_context.sh", carry=[".whl"])
source bench/device_calls/common.sh
log "long context: the graph variants, both shapes"
timeout 300 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-4B --shape Qwen3-0.6B --no-peers --seconds 0 \
  --workload decode128_ctx8192 --workload decode128_ctx32768 $(variants no-pipelining no-fused-kernels \
  no-fused-kernels-no-pipelining cublas-linears ngram) --out $R > $D/runlong.log 2>&1
log "exit $?"
log "0.6B int8-kv"
timeout 60 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-0.6B --no-peers --seconds 0 \
  --workload decode128_ctx1024 --workload prefill1024 --variant int8-kv --out $R > $D/runint8kv.log 2>&1
log "exit $?"
log "peers after 8k"
timeout 180 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-4B --shape Qwen3-0.6B --seconds 0 \
  --workload decode128_ctx8192 $(variants hf-sdpa engine-compiled) --out $R > $D/runpeers.log 2>&1
log "exit $?"; quiet $D/runpeers.log | tail -60 | tee -a $OUT/probe.log
cp $R/results.json $R/results.md $R/results.png $OUT/ 2>/dev/null
tar czf $OUT/details.tgz -C /tmp details
