#!/usr/bin/env bash
# One device call (session 5): the one-kernel-per-op rows again beside the default, so that their
# gains are same-run ratios on the current kernels (their decode rows came from runs before the
# attention-input trigger fix, whose defaults were slower). Writes straight into $OUT, so that a
# call cut short still returns the rows it measured.
#   run(command="COMMIT=$(git rev-parse --short HEAD) bash bench/device_calls/per_op_rows.sh", carry=[".whl"], timeout_s=200)
source bench/device_calls/common.sh
cp $R/results.json $OUT/
W="--workload decode128_ctx1024 --workload decode128_ctx8192 --workload decode128_ctx32768"
for S in Qwen3-0.6B Qwen3-4B; do
  log "$S"
  python3 bench/run.py --commit ${COMMIT:-unknown} --shape $S --seconds 0.5 --no-peers $W \
    $(variants default no-fused-kernels no-fused-kernels-no-pipelining) --out $OUT > $D/run_$S.log 2>&1
  log "exit $?"; quiet $D/run_$S.log | grep -A6 "### Ablation" | tee -a $OUT/probe.log
done
