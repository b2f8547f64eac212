#!/usr/bin/env bash
# One device call (session 4, last): GPU tests of the engine and the models on the final kernels,
# then where the decode attention's kernels let the next kernel launch (decode_step_experiments.py:
# the rule, at their start, against after their grid dependency wait), both shapes, 1,024 and 32,768.
#   run(command="bash bench/device_calls/attention_trigger.sh", carry=[".whl"], timeout_s=400)
source bench/device_calls/common.sh
log "GPU tests: engine, models, paged attention"
timeout 150 python3 -m pytest -q -rf -p no:cacheprovider -m gpu tests/core tests/models \
  tests/backends/triton/test_paged_attention.py > $D/pytest.log 2>&1
log "pytest exit $?"; grep -E "^(FAILED|ERROR)| passed| failed" $D/pytest.log | tail -20 | tee -a $OUT/probe.log
log "experiments"
timeout 200 python3 bench/kernels/decode_step_experiments.py --shapes Qwen3-4B,Qwen3-0.6B --contexts 1024,32768 \
  --variants rule,attn-trigger-after-wait,combine-trigger-after-wait --rounds 3 --out $D \
  2>&1 | quiet | tee $D/experiments.log | grep -E "ctx|H200" | tee -a $OUT/probe.log
cp $D/decode_step_experiments.json $OUT/ 2>/dev/null
tar czf $OUT/details.tgz -C /tmp details
