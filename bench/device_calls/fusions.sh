#!/usr/bin/env bash
# One device call (session 3, call 1): the RMSNorm-prologue / residual-epilogue GEMV and the
# one-kernel attention inputs on the H200: all GPU tests, the whole-step linears (plain, norms as
# kernels, norms fused), the CUDA-graph table's rows at both shapes, prefill against cuBLAS, and
# a profile of each shape's decode step.
#   run(command="COMMIT=$(git rev-parse --short HEAD) bash bench/device_calls/fusions.sh", carry=[".whl"])
# $OUT: probe.log (what to read), results.json / results.md, details.tgz
source bench/device_calls/common.sh
log "GPU tests"
timeout ${TEST_S:-220} python3 -m pytest -q -p no:cacheprovider -m gpu tests > $D/pytest.log 2>&1
log "pytest exit $?"; grep -E "^(FAILED|ERROR)| passed| failed" $D/pytest.log | tail -30 | tee -a $OUT/probe.log
log "linears of a decode step, one CUDA graph"
timeout 75 python3 bench/kernels/bench_decode_linears.py --tokens 1 --rep-ms 120 --out $D 2>&1 | tee -a $OUT/probe.log
log "CUDA-graph table rows, both shapes"
timeout 200 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-4B --shape Qwen3-0.6B --no-peers --seconds 0 \
  --workload decode128_ctx1024 $(variants default no-pipelining tile-eager no-fused-kernels \
  no-fused-kernels-no-pipelining unfused-eager cublas-linears) --out $R > $D/run.log 2>&1
log "run.py exit $?"; quiet $D/run.log | tail -40 | tee -a $OUT/probe.log
log "prefill against cuBLAS"
timeout 60 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-4B --shape Qwen3-0.6B --no-peers --seconds 0 \
  --workload prefill1024 $(variants default cublas-linears) --out $R > $D/run_prefill.log 2>&1
log "run.py exit $?"; quiet $D/run_prefill.log | tail -20 | tee -a $OUT/probe.log
log "profile"
timeout 70 python3 bench/kernels/profile_decode_step.py --steps 16 --out $D > $D/profile.log 2>&1
log "profile exit $?"; head -c 6000 $D/profile.log >> $OUT/probe.log
cp $R/results.json $R/results.md $R/results.png $OUT/ 2>/dev/null
tar czf $OUT/details.tgz -C /tmp details
