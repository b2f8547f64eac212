#!/usr/bin/env bash
# The H200 benchmark matrix of one commit, measured from scratch in parts that each fit one device
# call, and the GPU-marked tests.
#
# The matrix: 2 shapes (Qwen3-0.6B, Qwen3-4B) x (the 18 variants of bench/variants.py and the 3
# peers of bench/peers.py) x 4 workloads (bench/workloads.py), random weights. It does not fit one
# device call (10 minutes), so it runs in parts; minutes are estimates from earlier calls of the same
# rows (setup, checkpoint and Triton compilation included; the machine's start, 1-2 minutes, not):
#
#   part   rows (each part measures its shape's default first)                          minutes
#   1      Qwen3-0.6B: the CUDA-graph chain and the fusion ablations                       5
#   2      Qwen3-0.6B: reference, dense attention, torch matmul, INT8, ngram, no graphs    5
#   3      Qwen3-4B: the CUDA-graph chain and the fusion ablations                         7
#   4      Qwen3-4B: reference, dense attention, torch matmul, INT8, ngram, no graphs      7
#   5      Qwen3-0.6B: the peers                                                           6
#   6      Qwen3-4B: the peers                                                             7
#   tests  every GPU-marked test (pytest -m gpu tests)                                     4
#
# All of it takes about 50 minutes of device time with the starts, more than one session's 30:
# run parts 1-3 and tests in one session and 4-6 in the next, on the same commit.
# Each part is one run of bench/run.py, so every gain in results.md divides by a default measured
# in the same call (bench/report.py leaves a gain across parts blank).
#
# Here, once:      bash bench/device.sh wheels          # the wheels the GPU machine lacks, into .whl/
# On the GPU, one device call per part, with the working tree clean (`git status` here shows no
# change) and COMMIT its commit, written out: the device's own git HEAD can be an older commit.
#   run(command="COMMIT=abc1234 bash bench/gpu_matrix.sh 1", carry=[".whl"], timeout_s=600)
#   ... parts 2 to 6 and tests alike. On a machine of several GPUs, several parts at once, one per
#   GPU: `bash bench/gpu_matrix.sh 1 2` (host-bound rows then share the host's cores).
# Here, when every part is back (each comes back as $OUT/partN/results.json, results.md, run.log):
#   python bench/report.py --merge FILES_AT/part1 ... FILES_AT/part6 --out bench/results/NVIDIA-H200
# which writes results.json, results.md and results.png there from scratch and refuses parts of
# different commits. Environment: COMMIT (required), PART_S (seconds a part may run before it is
# stopped, keeping the rows it measured; default 560), TEST_S (the tests' limit; default 540),
# CHECKPOINTS (random-weight checkpoints, written once per machine; default /tmp/tileinfer-checkpoints).
# `bash bench/gpu_matrix.sh --list` prints each part's shape and rows (anywhere; it runs nothing).
set -u
export PYTHONUNBUFFERED=1
usage() { echo "usage: bash bench/gpu_matrix.sh PART [PART ...]   (PART: 1-6 or tests; see the top of this file)" >&2; exit 2; }
(( $# )) || usage

GRAPH_CHAIN="eager eager-per-op no-fused-kernels no-fused-kernels-no-pipelining no-pipelining no-fused-linears
  no-fused-attention-inputs norm-prologue no-pdl"
REST="reference eager-per-op-dense-attention no-cuda-graphs torch-matmul eager-torch-matmul int8 int8-kv ngram"
PEERS="hf-sdpa hf-static-compile engine-compiled"
# part -> "SHAPE SECONDS_PER_ROW NAME..." (the default is added first)
declare -A PARTS=(
  [1]="Qwen3-0.6B 0.5 $GRAPH_CHAIN"
  [2]="Qwen3-0.6B 0.5 $REST"
  [3]="Qwen3-4B 0.5 $GRAPH_CHAIN"
  [4]="Qwen3-4B 0.5 $REST"
  [5]="Qwen3-0.6B 1 $PEERS"
  [6]="Qwen3-4B 1 $PEERS"
)
if [[ $1 == --list ]]; then  # PART SHAPE NAME... of each matrix part, for a check of its coverage
  for part in $(printf '%s\n' "${!PARTS[@]}" | sort -n); do
    spec=(${PARTS[$part]}); echo "$part ${spec[0]} default ${spec[*]:2}"
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
    timeout "${TEST_S:-540}" python3 -m pytest -q -rf -p no:cacheprovider -m gpu --durations=15 tests \
      > "$OUT/tests/pytest.log" 2>&1
    echo "tests: pytest exit $?"; grep -E "^(FAILED|ERROR)| passed| failed" "$OUT/tests/pytest.log" | tail -20
    return
  fi
  local spec=(${PARTS[$part]})  # word-split: SHAPE SECONDS NAME...
  local shape=${spec[0]} seconds=${spec[1]} dir="$OUT/part$part" args=()
  for name in default "${spec[@]:2}"; do args+=(--variant "$name"); done
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
