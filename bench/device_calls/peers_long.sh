#!/usr/bin/env bash
# One short device call (session 3, call 4): the peers after 8,192 cached positions, both shapes.
#   run(command="COMMIT=$(git rev-parse --short HEAD) bash bench/device_calls/peers_long.sh", carry=[".whl"], timeout_s=300)
source bench/device_calls/common.sh
timeout 230 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-4B --shape Qwen3-0.6B --seconds 0 \
  --workload decode128_ctx8192 $(variants hf-sdpa engine-compiled) --out $R > $D/runpeers.log 2>&1
log "run.py exit $?"; quiet $D/runpeers.log | grep -E "^\| (default|hf-|engine-)" | tee -a $OUT/probe.log
cp $R/results.json $R/results.md $R/results.png $OUT/ 2>/dev/null
