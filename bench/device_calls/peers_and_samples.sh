#!/usr/bin/env bash
# One device call (session 2, call 4): the static-cache compiled transformers peer, and the Qwen3-4B
# rows that had one sample, again with several.
#   run(command="COMMIT=$(git rev-parse --short HEAD) bash bench/device_calls/peers_and_samples.sh", carry=[".whl"])
source bench/device_calls/common.sh
log "peer: hf-static-compile, Qwen3-4B"
timeout 230 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-4B --seconds 0 --workload decode128_ctx1024 \
  --workload prefill1024 --variant hf-static-compile --out $R > $D/runpeer.log 2>&1
log "exit $?"; grep -vE "it/s|s/it|row/s" $D/runpeer.log | tail -5 | tee -a $OUT/probe.log
log "Qwen3-4B rows again, several samples"
timeout 100 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-4B --no-peers --seconds 1 \
  --workload decode128_ctx1024 --workload prefill1024 $(variants no-fused-kernels no-fused-kernels-no-pipelining \
  no-cuda-graphs unfused-eager ngram) --out $R > $D/run4.log 2>&1
log "exit $?"
cp $R/results.json $R/results.md $R/results.png $OUT/ 2>/dev/null
tar czf $OUT/details.tgz -C /tmp details
