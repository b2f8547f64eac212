#!/usr/bin/env bash
# One short device call (session 2, call 6): Qwen3-0.6B's slow eager variants and its peers.
#   run(command="COMMIT=... bash bench/device_calls/small_rest.sh", carry=[".whl"], timeout_s=200)
# $OUT/r: results.json of these rows only (merged into bench/results/NVIDIA-H200 here), probe.log
set -u
export PYTHONUNBUFFERED=1
source bench/device.sh setup > /dev/null 2>&1 || exit 1
variants() { for v in "$@"; do echo --variant $v; done; }
timeout 45 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-0.6B --no-peers --seconds 0 \
  --workload decode128_ctx1024 --workload prefill1024 $(variants reference unfused-refattn-eager int8 int8-kv) \
  --out $OUT/r > $OUT/probe.log 2>&1
echo "exit $?" >> $OUT/probe.log
timeout 125 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-0.6B --seconds 0 --workload decode128_ctx1024 \
  --workload prefill1024 $(variants hf-sdpa engine-compiled hf-static-compile) --out $OUT/r >> $OUT/probe.log 2>&1
echo "exit $?" >> $OUT/probe.log
