#!/usr/bin/env bash
# One device call (session 5): is the eager prefill host-bound? (prefill_host_time.py, both shapes)
# The default's prefill1024 measured 16.8 ms (4B) / 12.7 ms (0.6B) in session 4 and 29.0 / 19.0 ms
# in session 5's peers_warm.sh run, on a machine of the same kind.
#   run(command="bash bench/device_calls/prefill_host.sh", carry=[".whl"], timeout_s=240)
source bench/device_calls/common.sh
log "prefill: host enqueue, wall and kernel time"
timeout 180 python3 bench/kernels/prefill_host_time.py --out $D 2>&1 | quiet | tee $D/prefill_host.log | tee -a $OUT/probe.log
cp $D/prefill_host_time.json $OUT/ 2>/dev/null
tar czf $OUT/details.tgz -C /tmp details
