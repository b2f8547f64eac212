#!/usr/bin/env bash
# One device call (session 4): why the default decoded slower than `no-fused-attention` at long
# context, and the fix. The fused attention-input kernel let the decode attention launch at its
# start (PDL), i.e. while the qkv GEMV still ran; now it lets it launch after its grid dependency
# wait. 1. GPU tests of the kernels and plugins touched; 2. decode_step_experiments.py: the rule
# against the old trigger, PDL off for the inputs / the attention, the per-op inputs, after 1,024
# and 32,768 positions, both shapes; 3. the default and no-fused-attention rows of the matrix again.
#   run(command="COMMIT=$(git rev-parse --short HEAD) bash bench/device_calls/inputs_trigger.sh", carry=[".whl"])
source bench/device_calls/common.sh
log "GPU tests: attention inputs, PDL, plugins"
timeout 150 python3 -m pytest -q -rf -p no:cacheprovider -m gpu tests/backends/triton/test_attention_inputs.py \
  tests/backends/triton/test_pdl.py tests/plugins > $D/pytest.log 2>&1
log "pytest exit $?"; grep -E "^(FAILED|ERROR)| passed| failed" $D/pytest.log | tail -20 | tee -a $OUT/probe.log
log "experiments"
timeout 260 python3 bench/kernels/decode_step_experiments.py --shapes Qwen3-4B,Qwen3-0.6B --contexts 1024,32768 \
  --variants rule,inputs-early-trigger,inputs-no-pdl,attn-no-pdl,unfused-inputs --rounds 3 --out $D \
  2>&1 | quiet | tee $D/experiments.log | grep -E "ctx|H200" | tee -a $OUT/probe.log
log "matrix rows: default, no-fused-attention"
timeout 150 python3 bench/run.py --commit ${COMMIT:-unknown} --shape Qwen3-4B --shape Qwen3-0.6B --no-peers \
  --seconds 1 --workload decode128_ctx1024 --workload decode128_ctx8192 --workload decode128_ctx32768 \
  $(variants default no-fused-attention) --out $R > $D/run.log 2>&1
log "run.py exit $?"; quiet $D/run.log | grep -E "^\| (default|no-fused-attention) " | tee -a $OUT/probe.log
cp $R/results.json $R/results.md $R/results.png $OUT/ 2>/dev/null
tar czf $OUT/details.tgz -C /tmp details
