#!/usr/bin/env bash
# One device call (session 5): every GPU-marked test on the final kernels, slowest listed.
#   run(command="bash bench/device_calls/gpu_tests.sh", carry=[".whl"], timeout_s=600)
source bench/device_calls/common.sh
log "GPU tests: all of tests/ marked gpu"
timeout ${TEST_S:-520} python3 -m pytest -q -rf -p no:cacheprovider -m gpu --durations=15 tests \
  > $D/pytest.log 2>&1
log "pytest exit $?"; grep -E "^(FAILED|ERROR)| passed| failed|^[0-9.]+s " $D/pytest.log | tail -40 | tee -a $OUT/probe.log
tar czf $OUT/details.tgz -C /tmp details
