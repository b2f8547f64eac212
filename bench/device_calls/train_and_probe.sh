#!/usr/bin/env bash
# One device call (session 2, call 1): train the shipped models while probing the GPU.
#   run(command="bash bench/device_calls/train_and_probe.sh", carry=[".whl"], timeout_s=600)
# 1. the CPU stages of models/make_all.py (corpus, tokenizer, token streams) in the background,
#    while the GPU is free for timing: the whole-step linears chain and the engine with CUDA graphs;
# 2. training (make_all --resume reuses the prepared data) with the GPU correctness tests beside it
#    (correctness only: nothing is timed while the model trains).
# $OUT: target.tar.*, draft.tar.00, summary.json (unpack as models/README.md says), probe.log, details.tgz
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
timeout 200 python3 bench/kernels/bench_decode_linears.py --out $D 2>&1 | tee -a $OUT/probe.log
for shape in Qwen3-4B Qwen3-0.6B; do
  log "engine with CUDA graphs: $shape"
  timeout 150 python3 bench/reference_point.py --shape $shape --out $D --variant tile-eager --variant unfused-eager \
    cuda_graphs=true 2>&1 | grep -v Warning | tail -8 | tee -a $OUT/probe.log
done
log "waiting for prep"; wait $PREP; log "prep exit $?"; tail -3 $D/prep.log | tee -a $OUT/probe.log
log "training (background) + GPU tests"
( python3 models/make_all.py --out /tmp/models_out --resume --deadline-min 6.8 --target-min 4.2 --draft-min 1.2 \
  > $D/make_all.out 2>&1 ) &
TRAIN=$!
timeout 330 python3 -m pytest -q -p no:cacheprovider -m gpu tests/backends/triton tests/core tests/plugins \
  > $D/pytest.log 2>&1
log "pytest exit $?"; tail -25 $D/pytest.log | tee -a $OUT/probe.log
wait $TRAIN; log "make_all exit $?"; tail -12 $D/make_all.out | tee -a $OUT/probe.log
cp /tmp/models_out/*.tar.* /tmp/models_out/summary.json $OUT/ 2>/dev/null
cp /tmp/models_out/*.png /tmp/models_out/make_all.log $D/ 2>/dev/null
tar czf $OUT/details.tgz -C /tmp details
ls -la $OUT | tee -a $OUT/probe.log
