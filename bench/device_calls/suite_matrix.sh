#!/usr/bin/env bash
# One short device call (session 4): bench/suite.py in matrix mode (pytest-benchmark) on the GPU,
# a few rows of it: Qwen3-0.6B, the default at every workload and transformers eager after 1,024.
#   run(command="bash bench/device_calls/suite_matrix.sh", carry=[".whl"], timeout_s=150)
source bench/device_calls/common.sh
TILEINFER_BENCH_SHAPES=Qwen3-0.6B TILEINFER_BENCH_ROUNDS=2 timeout 120 python3 -m pytest -q -rs -p no:cacheprovider \
  bench/suite.py --benchmark-only -k "default or (hf-sdpa and ctx1024)" --benchmark-json $OUT/suite_benchmark.json \
  --benchmark-columns=median,rounds 2>&1 | quiet | tail -25
