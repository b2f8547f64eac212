#!/usr/bin/env bash
# One device call (session 5): transformers eager (hf-sdpa) decode is host-bound and peers_warm.sh
# took one sample per row (--seconds 1): 0.6B gave 27.7 / 35.1 / 36.5 tok/s after 1k / 8k / 32k,
# faster at longer context. Here several samples per row (median), the default in the same run.
#   run(command="COMMIT=$(git rev-parse --short HEAD) bash bench/device_calls/hf_sdpa_samples.sh", carry=[".whl"], timeout_s=480)
source bench/device_calls/common.sh
W="--workload decode128_ctx1024 --workload decode128_ctx8192 --workload decode128_ctx32768"
for S in Qwen3-0.6B Qwen3-4B; do
  log "$S: default and hf-sdpa, decode, 12 s per row"
  timeout 200 python3 bench/run.py --commit ${COMMIT:-unknown} --shape $S --seconds 12 $W \
    $(variants default hf-sdpa) --out $R > $D/run_$S.log 2>&1
  log "exit $?"; quiet $D/run_$S.log | grep -A5 "### Peers" | tee -a $OUT/probe.log
done
python3 - <<'PY' | tee -a $OUT/probe.log
import json
for r in json.load(open("bench/results/NVIDIA-H200/results.json")):
    if r["peer"] == "hf-sdpa" and r["workload"].startswith("decode"):
        print(r["shape"], r["workload"], "samples (tok/s):", [round(s, 2) for s in r["samples"]])
PY
cp $R/results.json $R/results.md $R/results.png $OUT/ 2>/dev/null
tar czf $OUT/details.tgz -C /tmp details
