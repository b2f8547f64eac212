#!/usr/bin/env bash
# The H200 benchmark matrix of one commit, measured from scratch in parts that each fit one device
# call, and the GPU-marked tests.
#
# The matrix: 2 shapes (Qwen3-0.6B, Qwen3-4B) x (the 19 variants of bench/variants.py and the 5
# peers of bench/peers.py) x 4 workloads (bench/workloads.py), random weights; the INT8 weights
# and their peers at 2 workloads only (prefill1024, decode128_ctx1024: the INT8 targets). It does
# not fit one device call (10 minutes), so it runs in parts; minutes are estimates from earlier
# calls of the same rows (setup, checkpoint and Triton compilation included; the machine's start,
# 1-2 minutes, not), parts 7 and 8 from parts 5 and 6 (one context to compile instead of three;
# not yet run as parts):
#
#   part   rows (each part measures its shape's default first)                          minutes
#   1      Qwen3-0.6B: the CUDA-graph chain and the fusion ablations                       5
#   2      Qwen3-0.6B: reference, dense attention, torch matmul, INT8 KV, ngram, no graphs 5
#   3      Qwen3-4B: the CUDA-graph chain and the fusion ablations                         7
#   4      Qwen3-4B: reference, dense attention, torch matmul, INT8 KV, ngram, no graphs   7
#   5      Qwen3-0.6B: the BF16 peers                                                      6
#   6      Qwen3-4B: the BF16 peers                                                        7
#   7      Qwen3-0.6B: INT8 weights and the INT8 peers (gpt-fast-style compiled, torchao)  5
#   8      Qwen3-4B: INT8 weights and the INT8 peers                                       7
#   tests  every GPU-marked test (TESTS=PATHS: some), over 8 processes (pytest-xdist)        5
#          (in one process the 1,068 tests took more than 9 minutes)
#
# All of it takes about 65 minutes of device time with the starts, more than two sessions' 30:
# run parts 1-3 and tests in one session, 4-6 in the next and 7-8 in a third, on the same commit.
# Parts 7 and 8 need the torchao wheel (bench/device.sh wheels; carry .whl): without it the
# hf-torchao-int8 rows record "cannot run: torchao does not import (...)". The other INT8 peers run
# elsewhere: gemlite's A16W8 GEMV per layer in bench/kernels/linear_int8.py (gemlite_us), and
# llama.cpp's Q8_0 in bench/llamacpp.sh bench (peer llama.cpp-q8_0).
# Each part is one run of bench/run.py, so every gain in results.md divides by a default measured
# in the same call (bench/report.py leaves a gain across parts blank).
#
# Here, once:      bash bench/device.sh wheels          # the wheels the GPU machine lacks, into .whl/
# On the GPU, one device call per part, with the working tree clean (`git status` here shows no
# change) and COMMIT its commit, written out: the device's own git HEAD can be an older commit.
#   run(command="COMMIT=abc1234 bash bench/gpu_matrix.sh 1", carry=[".whl"], timeout_s=600)
#   ... parts 2 to 8 and tests alike. On a machine of several GPUs, several parts at once, one per
#   GPU: `bash bench/gpu_matrix.sh 1 2` (host-bound rows then share the host's cores).
# Here, when every part is back (each comes back as $OUT/partN/results.json, results.md, run.log):
#   python bench/report.py --merge FILES_AT/part1 ... FILES_AT/part8 --out bench/results/NVIDIA-H200
# which writes results.json, results.md and results.png there from scratch and refuses parts of
# different commits. Environment: COMMIT (required), PART_S (seconds a part may run before it is
# stopped, keeping the rows it measured; default 560), TEST_S (the tests' limit; default 540),
# CHECKPOINTS (random-weight checkpoints, written once per machine; default /tmp/tileinfer-checkpoints),
# TESTS (the test paths of part tests; default tests), TEST_WORKERS (xdist processes; default 8).
# `bash bench/gpu_matrix.sh --list` prints each part's shape and rows, and after a `|` its workloads
# where the part does not run all four (anywhere; it runs nothing).
set -u
export PYTHONUNBUFFERED=1
usage() { echo "usage: bash bench/gpu_matrix.sh PART [PART ...]   (PART: 1-8 or tests; see the top of this file)" >&2; exit 2; }
(( $# )) || usage

GRAPH_CHAIN="eager eager-per-op no-fused-kernels no-fused-kernels-no-pipelining no-pipelining no-fused-linears
  no-fused-attention-inputs norm-prologue no-pdl"
REST="reference eager-per-op-dense-attention no-cuda-graphs torch-matmul eager-torch-matmul int8-kv int8-int8-kv ngram"
PEERS="hf-sdpa hf-static-compile engine-compiled"
INT8="int8 engine-compiled-int8 hf-torchao-int8"  # our INT8 weights beside the INT8 weight-only peers
# part -> "SHAPE SECONDS_PER_ROW NAME..." (the default is added first)
declare -A PARTS=(
  [1]="Qwen3-0.6B 0.5 $GRAPH_CHAIN"
  [2]="Qwen3-0.6B 0.5 $REST"
  [3]="Qwen3-4B 0.5 $GRAPH_CHAIN"
  [4]="Qwen3-4B 0.5 $REST"
  [5]="Qwen3-0.6B 1 $PEERS"
  [6]="Qwen3-4B 1 $PEERS"
  [7]="Qwen3-0.6B 1 $INT8"
  [8]="Qwen3-4B 1 $INT8"
)
# part -> the workloads it runs, where not all four (bench/run.py's default)
declare -A WORKLOADS=(
  [7]="prefill1024 decode128_ctx1024"
  [8]="prefill1024 decode128_ctx1024"
)
if [[ $1 == --list ]]; then  # PART SHAPE NAME... of each matrix part, for a check of its coverage
  for part in $(printf '%s\n' "${!PARTS[@]}" | sort -n); do
    spec=(${PARTS[$part]}); echo "$part ${spec[0]} default ${spec[*]:2}${WORKLOADS[$part]:+ | ${WORKLOADS[$part]}}"
  done
  exit 0
fi
for part in "$@"; do [[ $part == tests || -n ${PARTS[$part]:-} ]] || usage; done
: "${OUT:?OUT: the folder whose files come back (set by the device tool)}"

[[ -n ${COMMIT:-} ]] || { echo "error: set COMMIT=<short hash of the commit checked out here>" >&2; exit 2; }
source bench/device.sh setup || exit 1

run_part() {  # run_part PART: one run of bench/run.py (or the tests) into $OUT/PART...
  local part=$1
  if [[ $part == tests ]]; then
    mkdir -p "$OUT/tests"
    local workers=()  # pytest-xdist (carried in .whl): test files spread over processes sharing the GPU
    python3 -c "import xdist" 2>/dev/null && workers=(-n "${TEST_WORKERS:-8}" --dist loadfile)
    timeout "${TEST_S:-540}" python3 -m pytest -v -rfE -p no:cacheprovider -m gpu --durations=15 "${workers[@]}" \
      ${TESTS:-tests} > "$OUT/tests/pytest.log" 2>&1
    echo "tests: pytest exit $? (${#workers[@]} xdist args)"
    grep -E "FAILED|ERROR| passed| failed" "$OUT/tests/pytest.log" | cut -c1-200 | tail -30
    return
  fi
  local spec=(${PARTS[$part]})  # word-split: SHAPE SECONDS NAME...
  local shape=${spec[0]} seconds=${spec[1]} dir="$OUT/part$part" args=()
  for name in default "${spec[@]:2}"; do args+=(--variant "$name"); done
  for w in ${WORKLOADS[$part]:-}; do args+=(--workload "$w"); done
  mkdir -p "$dir"
  timeout "${PART_S:-560}" python3 bench/run.py --commit "$COMMIT" --shape "$shape" --seconds "$seconds" \
    --checkpoints "${CHECKPOINTS:-/tmp/tileinfer-checkpoints}" --out "$dir" "${args[@]}" > "$dir/run.log" 2>&1
  echo "part $part ($shape): run.py exit $? (124: stopped at PART_S, the rows measured are kept)"
  rm -f "$dir/results.png"  # drawn once, by the merge
  grep -E "^(skip|failed) " "$dir/run.log"
}

gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())')
if (( $# > gpus )); then
  echo "error: $# parts at once need $# GPUs; $gpus visible" >&2; exit 2
fi
i=0
for part in "$@"; do
  CUDA_VISIBLE_DEVICES=$i run_part "$part" &
  i=$((i + 1))
done
wait
