#!/usr/bin/env bash
# One device call (session 3, call 2): the GPU tests that call 1 could not finish or got wrong
# (a test bug: 0.6B layer names), the whole-step linears with contraction back on, rules tried
# inside the engine (bench/kernels/decode_step_experiments.py), and the CUDA-graph table rows.
#   run(command="COMMIT=$(git rev-parse --short HEAD) bash bench/device_calls/fusions_2.sh", carry=[".whl"])
source bench/device_calls/common.sh
log "GPU tests: linears, norms, attention inputs, PDL, engine"
timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/backends/triton/test_linear.py \
  tests/backends/triton/test_norm.py tests/backends/triton/test_attention_inputs.py tests/backends/triton/test_pdl.py \
  tests/core tests/plugins tests/models -k "not real_shapes_match and not swiglu_epilogue_bit" > $D/pytest.log 2>&1
log "pytest exit $?"; grep -E "^(FAILED|ERROR)| passed| failed" $D/pytest.log | tail -30 | tee -a $OUT/probe.log
log "linears of a decode step, one CUDA graph"
timeout 60 python3 bench/kernels/bench_decode_linears.py --tokens 1 --rep-ms 120 --out $D 2>&1 | tee -a $OUT/probe.log
log "rules tried in the engine"
timeout 150 python3 bench/kernels/decode_step_experiments.py --out $D > $D/experiments.log 2>&1
log "exit $?"; grep -vE "Warning|warn" $D/experiments.log | tail -20 | tee -a $OUT/probe.log
log "CUDA-graph table rows, both shapes"
timeout 130 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-4B --shape Qwen3-0.6B --no-peers --seconds 0 \
  --workload decode128_ctx1024 $(variants default no-pipelining tile-eager no-fused-kernels \
  no-fused-kernels-no-pipelining unfused-eager cublas-linears) --out $R > $D/run.log 2>&1
log "run.py exit $?"; quiet $D/run.log | grep -A12 "CUDA graphs (decode" | tee -a $OUT/probe.log
cp $R/results.json $R/results.md $R/results.png $OUT/ 2>/dev/null
tar czf $OUT/details.tgz -C /tmp details
