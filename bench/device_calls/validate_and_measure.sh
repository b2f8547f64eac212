#!/usr/bin/env bash
# One device call (session 2, call 2): the GPU tests, the whole-step linears, and the Qwen3-4B
# ablation matrix at the reference point (prefill1024, decode128_ctx1024).
#   run(command="bash bench/device_calls/validate_and_measure.sh", carry=[".whl"], timeout_s=600)
# $OUT: probe.log (what to read), results.json / results.md (bench/results/NVIDIA-H200/), details.tgz
source bench/device_calls/common.sh
log "GPU tests"
timeout ${TEST_S:-210} python3 -m pytest -q -p no:cacheprovider -m gpu tests > $D/pytest.log 2>&1
log "pytest exit $?"; grep -E "^(FAILED|ERROR)| passed| failed" $D/pytest.log | tail -40 | tee -a $OUT/probe.log
log "linears of a decode step, one CUDA graph"
timeout 70 python3 bench/kernels/bench_decode_linears.py --tokens 1 --rep-ms 150 --out $D 2>&1 | tee -a $OUT/probe.log
log "matrix: Qwen3-4B"
V="default no-pipelining tile-eager cublas-linears-eager no-fused-kernels no-fused-kernels-no-pipelining unfused-eager no-cuda-graphs cublas-linears ngram"
timeout ${MATRIX_S:-250} python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-4B --no-peers --seconds 0 --workload decode128_ctx1024 \
  --workload prefill1024 $(for v in $V; do echo --variant $v; done) --out $R > $D/run.log 2>&1
log "run.py exit $?"; grep -vE "it/s|s/it|row/s|Warning|warn" $D/run.log | tail -50 | tee -a $OUT/probe.log
cp $R/results.json $R/results.md $OUT/ 2>/dev/null
tar czf $OUT/details.tgz -C /tmp details
