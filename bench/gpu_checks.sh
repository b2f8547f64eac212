#!/usr/bin/env bash
# The H200 measurements beside the matrix (bench/gpu_matrix.sh): step costs, kernel sweeps, the
# speculative table, time to first token of long prompts. Each check fits one device call; minutes
# are estimates (setup, checkpoints and Triton compilation included, the machine's start not):
#
#   check     what                                                                         minutes
#   steps     bench/step_costs.py (default and no-pdl, with kernel profiles; the shipped model's
#             steps and its device loop's steps), bench/pdl_probe.py                               6
#   gemv      GEMV tiles at T = 1, 2, 16 (bench/kernels/linear.py and linear_int8.py --sweep, with
#             the fused split-K reduce; gemlite's A16W8 beside the int8 rows), the int8 decode
#             attention with and without its tile prefetch (paged_attention.py --int8-prefetch)      8
#   gemm      prefill GEMM tiles at T = 1,024, the persistent GEMMs among them (both scripts)       9
#   spec      bench/speculative.py on the shipped family (device loop; every proposer's best k), the
#             device loop's step per proposer and k in the same call (step_costs.py --loop: what
#             the speedups divide by) and bench/dflash_step.py (one DFlash step at the Qwen3-4B
#             shape against a decode step)                                                          7
#   ttft      bench/run.py at prefill1024 (both shapes): the default, no-cuda-graphs, torch-matmul
#             (cuBLAS linears) and the peers hf-sdpa and engine-compiled in the same run; then
#             prefill8192 / prefill32768 at Qwen3-4B (time to first token, % of the matmul peak)  8
#
# On the GPU, one device call per check, COMMIT the commit checked out here (written out):
#   run(command="COMMIT=abc1234 bash bench/gpu_checks.sh steps", carry=[".whl"], timeout_s=600)
# Each check writes its records under $OUT/CHECK/ and prints a short table; copy the records into
# bench/results/NVIDIA-H200/ (the README and docs/performance-log.md cite them from there).
# Environment: COMMIT (required), CHECK_S (seconds a check may run; default 560).
set -u
export PYTHONUNBUFFERED=1
usage() { echo "usage: bash bench/gpu_checks.sh CHECK   (CHECK: steps, gemv, gemm, spec or ttft; see the top of this file)" >&2; exit 2; }
(( $# == 1 )) || usage
check=$1
[[ $check =~ ^(steps|gemv|gemm|spec|ttft)$ ]] || usage
: "${OUT:?OUT: the folder whose files come back (set by the device tool)}"
[[ -n ${COMMIT:-} ]] || { echo "error: set COMMIT=<short hash of the commit checked out here>" >&2; exit 2; }
source bench/device.sh setup || exit 1
dir=$OUT/$check && mkdir -p "$dir"
began=$SECONDS
left() { echo $(( ${CHECK_S:-560} - (SECONDS - began) )); }  # seconds left of the check's budget
step() { local budget=$1; shift; (( $(left) > 30 )) && timeout "$(( budget < $(left) ? budget : $(left) ))" "$@"; }

case $check in
steps)
  step 300 python3 bench/step_costs.py --profile --variant default --variant no-pdl --commit "$COMMIT" --out "$dir" \
    > "$dir/step_costs.log" 2>&1; grep -E "T= ?[0-9]+ " "$dir/step_costs.log" | head -40
  step 90 python3 bench/step_costs.py --model models/target --contexts 1024 --loop ngram@15 --loop draft@7 \
    --loop dflash@7 --commit "$COMMIT" --out "$dir/shipped" > "$dir/step_costs_shipped.log" 2>&1
  grep -E "T= ?[0-9]+ |loop N" "$dir/step_costs_shipped.log"
  step 240 python3 bench/pdl_probe.py --out "$dir/pdl_probe.json" > "$dir/pdl_probe.log" 2>&1
  cat "$dir/pdl_probe.log" | grep "T=" ;;
gemv)
  step 200 python3 bench/kernels/linear.py --sweep --tokens 2,16 --repeats 20 --out "$dir" > "$dir/linear.log" 2>&1
  grep -vE "^\s*$" "$dir/linear.log" | tail -40 | cut -c1-150
  step 200 python3 bench/kernels/linear_int8.py --sweep --tokens 1,16 --repeats 20 --out "$dir" \
    > "$dir/linear_int8.log" 2>&1; grep -vE "^\s*$" "$dir/linear_int8.log" | tail -40 | cut -c1-150
  step 120 python3 bench/kernels/paged_attention.py --kv bf16,int8 --contexts 8192,32768 --int8-prefetch --out "$dir" \
    > "$dir/paged_attention.log" 2>&1; grep -E "int8/bf16" "$dir/paged_attention.log" ;;
gemm)
  step 270 python3 bench/kernels/linear.py --sweep --tokens 1024 --repeats 20 --out "$dir" > "$dir/linear.log" 2>&1
  grep -vE "^\s*$" "$dir/linear.log" | tail -40 | cut -c1-150
  step 270 python3 bench/kernels/linear_int8.py --sweep --tokens 1024 --repeats 20 --out "$dir" \
    > "$dir/linear_int8.log" 2>&1; grep -vE "^\s*$" "$dir/linear_int8.log" | tail -40 | cut -c1-150 ;;
spec)
  step 330 python3 bench/speculative.py --device cuda --new-tokens 256 --repeats 3 --k ngram=7,15 --k draft=3,7 \
    --k dflash=7,15 --commit "$COMMIT" --out "$dir/speculative_target.json" > "$dir/speculative.log" 2>&1
  tail -25 "$dir/speculative.log" | cut -c1-160
  step 90 python3 bench/step_costs.py --model models/target --contexts 1024 --repeats 40 --loop ngram@7 \
    --loop ngram@15 --loop draft@3 --loop draft@7 --loop dflash@7 --loop dflash@15 --commit "$COMMIT" \
    --out "$dir/shipped" > "$dir/step_costs_shipped.log" 2>&1; grep -E "T= ?[0-9]+ |loop N" "$dir/step_costs_shipped.log"
  step 150 python3 bench/dflash_step.py --commit "$COMMIT" --out "$dir" > "$dir/dflash_step.log" 2>&1
  tail -14 "$dir/dflash_step.log" ;;
ttft)
  step 330 python3 bench/run.py --commit "$COMMIT" --shape Qwen3-0.6B --shape Qwen3-4B --variant default \
    --variant no-cuda-graphs --variant torch-matmul --variant hf-sdpa --variant engine-compiled \
    --workload prefill1024 --out "$dir/prefill1024" > "$dir/prefill1024.log" 2>&1
  grep -E "^\| (default|no-cuda-graphs|torch-matmul|hf-sdpa|engine-compiled) " "$dir/prefill1024/results.md" | head -24
  step 260 python3 bench/run.py --commit "$COMMIT" --shape Qwen3-4B --variant default --workload prefill8192 \
    --workload prefill32768 --no-peers --out "$dir/long" > "$dir/long.log" 2>&1
  grep -A6 "### Summary" "$dir/long/results.md" | head -12 ;;
esac
echo "$check: done in $((SECONDS - began)) s"
