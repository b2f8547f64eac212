#!/usr/bin/env bash
# One device call (session 4, after inputs_trigger.sh): the rows of every variant that runs the fused
# attention-input kernel again, with its new trigger (commit 6bbecb8), all four workloads, both shapes.
#   run(command="bash bench/device_calls/graph_rows.sh", carry=[".whl"], timeout_s=450)
source bench/device_calls/common.sh
timeout 400 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-4B --shape Qwen3-0.6B --no-peers --seconds 0 \
  $(variants default no-pipelining no-fused-linears norm-prologue cublas-linears ngram tile-eager no-cuda-graphs int8) \
  --out $R > $D/run.log 2>&1
echo "exit $?"; quiet $D/run.log | grep -A40 "### Ablation" | grep -E "^\|"
cp $R/results.json $R/results.md $R/results.png $OUT/
