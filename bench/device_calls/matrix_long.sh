#!/usr/bin/env bash
# One device call per shape (session 4): the cells of the H200 matrix still empty after session 3,
# with the default measured again in the same run.
#   1. default and the fused-kernel ablations after 8,192 and 32,768 positions (several samples);
#   2. the peers not yet measured there: transformers eager SDPA after 32,768, transformers static
#      cache + torch.compile after 8,192 and 32,768, the engine's reference model compiled after
#      32,768 (its eager prefill materializes float32 scores: a failure records the reason);
#   3. the new ablation rows after 1,024 (decode and prefill) beside the default;
#   4. the eager and reference variants after 8,192 and 32,768, until the call's deadline.
# Each step gets what is left of the deadline; run.py writes results.json after each variant, so
# a step cut short keeps the rows it measured.
#   run(command="COMMIT=$(git rev-parse --short HEAD) bash bench/device_calls/matrix_long.sh Qwen3-4B",
#       carry=[".whl"], timeout_s=600)
source bench/device_calls/common.sh
S=${1:?shape: Qwen3-0.6B or Qwen3-4B}
DEADLINE=${DEADLINE:-565}
left() { local n=$(( DEADLINE - SECONDS )); echo $(( n > 1 ? n : 1 )); }
LONG="--workload decode128_ctx8192 --workload decode128_ctx32768"
run() { local name=$1 cap=$2; shift 2; local t=$(left); (( t > cap )) && t=$cap
  log "$S $name (timeout ${t}s)"
  timeout $t python3 bench/run.py --commit ${COMMIT:-unknown} --shape $S --out $R "$@" > $D/run_$name.log 2>&1
  log "exit $?"; quiet $D/run_$name.log | grep -E "^(skip|failed) " | tee -a $OUT/probe.log; }
run graphs 120 --no-peers --seconds 1 $LONG $(variants default no-fused-kernels no-fused-linears no-fused-attention)
run peers 330 --seconds 0 --workload decode128_ctx8192 --workload decode128_ctx32768 --variant hf-static-compile
run peers32k 150 --seconds 0 --workload decode128_ctx32768 $(variants hf-sdpa engine-compiled)
run short 80 --no-peers --seconds 0 --workload decode128_ctx1024 --workload prefill1024 \
  $(variants default no-fused-linears no-fused-attention norm-prologue)
run eager 600 --no-peers --seconds 0 $LONG $(variants no-fused-kernels-no-pipelining norm-prologue no-cuda-graphs \
  unfused-eager cublas-linears-eager int8 reference unfused-refattn-eager int8-kv)
S=$S python3 - <<'PY' | tee -a $OUT/probe.log
import json, os
rows = [r for r in json.load(open("bench/results/NVIDIA-H200/results.json")) if r["shape"] == os.environ["S"]]
for r in sorted(rows, key=lambda r: (r["workload"], r["variant"] or "~" + r["peer"])):
    v = "-" if r["value"] is None else f"{r['value']:.1f} {r['unit']}"
    print(f"{r['workload']:20} {r['variant'] or r['peer']:32} {v:>14} {r['commit']} {(r['note'] or '')[:70]}")
PY
cp $R/results.json $R/results.md $R/results.png $OUT/ 2>/dev/null
tar czf $OUT/details.tgz -C /tmp details
