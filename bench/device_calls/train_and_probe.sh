#!/usr/bin/env bash
# One device call (session 2, call 1): train the shipped models while probing the GPU.
#   run(command="bash bench/device_calls/train_and_probe.sh", carry=[".whl"], timeout_s=600)
# 1. the CPU stages of models/make_all.py (corpus, tokenizer, token streams) in the background,
#    while the GPU is free for timing: the whole-step linears chain and the engine with CUDA graphs;
# 2. training (make_all --resume reuses the prepared data) with the GPU correctness tests beside it
#    (correctness only: nothing is timed while the model trains).
# $OUT: m/ (target.tar.*, draft.tar.00, summary.json: unpack as models/README.md says), probe.log, details.tgz
set -u
export PYTHONUNBUFFERED=1
source bench/device.sh setup || exit 1
D=/tmp/details; mkdir -p $D
W=build/models-work
log() { echo "[$(date +%T)] $*" | tee -a $OUT/probe.log; }
log "prep: corpus, tokenizer, streams (background)"
( python3 models/corpus.py $W/corpus && python3 models/tokenizer.py $W/corpus $W/tokenizer --vocab 8192 --sample-mb 48 \
  && python3 models/data.py $W/corpus $W/tokenizer $W/data --max-train-mb 320 ) > $D/prep.log 2>&1 &
PREP=$!
log "linears of a decode step, one CUDA graph"
timeout 120 python3 bench/kernels/bench_decode_linears.py --tokens 1,16 --rep-ms 200 --out $D 2>&1 | tee -a $OUT/probe.log
log "engine with CUDA graphs: Qwen3-4B"
timeout 100 python3 bench/reference_point.py --shape Qwen3-4B --out $D --variant tile-eager --runs 2 \
  cuda_graphs=true > $D/reference_point.log 2>&1; tail -4 $D/reference_point.log | tee -a $OUT/probe.log
log "waiting for prep"; wait $PREP; log "prep exit $?"; tail -3 $D/prep.log | tee -a $OUT/probe.log
log "training (background) + GPU tests"
( python3 models/make_all.py --out $OUT/m --resume --deadline-min 5.6 --target-min 3.4 --draft-min 0.9 \
  > $D/make_all.out 2>&1 ) &
TRAIN=$!
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/backends/triton tests/core tests/plugins \
  > $D/pytest.log 2>&1
log "pytest exit $?"; tail -25 $D/pytest.log | tee -a $OUT/probe.log
wait $TRAIN; log "make_all exit $?"; tail -12 $D/make_all.out | tee -a $OUT/probe.log
mv $OUT/m/*.png $OUT/m/make_all.log $D/ 2>/dev/null
tar czf $OUT/details.tgz -C /tmp details
ls -la $OUT | tee -a $OUT/probe.log
