#!/usr/bin/env bash
# Prepared in session 4 for the next (not run yet): the three peers again at every workload, one
# shape per call, with the whole-workload warm-up (workloads.warm_up); the default in the same run.
# Until session 4 a peer was warmed up by 8 tokens only, and transformers' first whole run of a
# length allocates its growing cache: bench/suite.py in matrix mode timed Qwen3-0.6B hf-sdpa after
# 1,024 tokens at 8.30 s for its first run and 3.41 s for its second (suite_matrix.sh).
#   run(command="COMMIT=$(git rev-parse --short HEAD) bash bench/device_calls/peers_warm.sh Qwen3-4B",
#       carry=[".whl"], timeout_s=600)
source bench/device_calls/common.sh
S=${1:?shape: Qwen3-0.6B or Qwen3-4B}
log "$S: default and the peers, every workload"
timeout 560 python3 bench/run.py --commit ${COMMIT:-unknown} --shape $S --seconds 1 \
  $(variants default hf-sdpa hf-static-compile engine-compiled) --out $R > $D/run_peers.log 2>&1
log "exit $?"; quiet $D/run_peers.log | grep -A8 "### Peers" | tee -a $OUT/probe.log
cp $R/results.json $R/results.md $R/results.png $OUT/ 2>/dev/null
tar czf $OUT/details.tgz -C /tmp details
