#!/usr/bin/env bash
# llama.cpp as a peer on the GPU machine: its source here, its build and llama-bench there.
#
# Here, once (needs the package index):
#   bash bench/llamacpp.sh prepare
# downloads the llama-cpp-python 0.3.36 sdist, keeps its vendored llama.cpp tree without the
# models, docs and the ggml backends other than CPU and CUDA, and packs it as .peer/llama.cpp.tgz
# (about 7 MB; .peer/ is ignored by git, carried to the GPU machine).
# On the GPU machine:
#   run(command="COMMIT=abc1234 bash bench/llamacpp.sh bench Qwen3-0.6B", carry=[".peer", ".whl"])
#   run(command="COMMIT=abc1234 bash bench/llamacpp.sh bench Qwen3-4B", carry=[".peer", ".whl"])
# builds llama-bench (`build` alone does only that, e.g. in the background while the GPU is busy;
# `bench` then reuses it, also in a later call while the machine stays warm) (CUDA, sm_90, Ninja),
# converts the same random checkpoint as bench/run.py uses to a BF16 GGUF and to a Q8_0 GGUF
# (bench/llamacpp_peer.py gguf [--outtype q8_0]), runs llama-bench on each at the matrix's sizes
# (pp1024 from an empty cache; tg128 at depths 0 and 1024, flash attention, all layers on the GPU,
# 3 repetitions) and writes the matrix's rows to $OUT/llamacpp/results.json (peers "llama.cpp" and
# "llama.cpp-q8_0"). TYPES="bf16" or TYPES="q8_0" measures one of them (default both).
# Minutes (setup and checkpoint writing included): the build 4-6 (234 and 369 s measured); per
# shape about 1 for BF16 (measured); Q8_0 adds its conversion (numpy on one core: 12 s for 0.6B on
# this project's CPU, so about 80 s for 4B, estimated) and its llama-bench (about as long as
# BF16's), so about 1 more at 0.6B and 2-3 at 4B (not yet measured there). Both shapes and both
# types after a build may not fit one 10-minute call: one shape per call, as above.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.36
TREE=llama_cpp_python-$VERSION/vendor/llama.cpp
case "${1:-}" in
prepare)
  work=$(mktemp -d)
  python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$work"
  tar xzf "$work/llama_cpp_python-$VERSION.tar.gz" -C "$work"
  tree=$work/$TREE
  rm -rf "$tree"/{models,docs,media,tools/ui,benches,.github}
  for b in cann openvino webgpu et metal hexagon sycl vulkan opencl virtgpu zdnn zendnn musa hip; do
    rm -rf "$tree/ggml/src/ggml-$b"
  done
  mkdir -p "$tree/models" .peer
  tar czf .peer/llama.cpp.tgz -C "$(dirname "$tree")" llama.cpp
  rm -rf "$work"
  ls -la .peer/llama.cpp.tgz ;;
build)
  # llama-bench only (CPU work: it can run while the GPU does something else); bench reuses it
  : "${OUT:?OUT: the folder whose files come back}"
  [[ -f .peer/llama.cpp.tgz ]] || { echo "error: .peer/llama.cpp.tgz is missing: run 'bash bench/llamacpp.sh prepare' here and carry .peer" >&2; exit 2; }
  build=/tmp/llamacpp && mkdir -p "$build" "$OUT/llamacpp"
  [[ -x "$build/out/bin/llama-bench" ]] && exit 0
  tar xzf .peer/llama.cpp.tgz -C "$build"
  began=$SECONDS
  cmake -S "$build/llama.cpp" -B "$build/out" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_CURL=OFF > "$OUT/llamacpp/build.log" 2>&1
  cmake --build "$build/out" --target llama-bench -j"${JOBS:-16}" >> "$OUT/llamacpp/build.log" 2>&1 \
    || { tail -30 "$OUT/llamacpp/build.log"; exit 1; }
  echo "llama-bench built in $((SECONDS - began)) s" ;;
bench)
  shift
  (( $# )) || { echo "usage: bash bench/llamacpp.sh bench SHAPE..." >&2; exit 2; }
  bash "$0" build || exit 1
  source bench/device.sh setup || exit 1
  build=/tmp/llamacpp
  for shape in "$@"; do
    for type in ${TYPES:-bf16 q8_0}; do
      name=$shape && [[ $type == bf16 ]] || name=$shape.$type  # bench/llamacpp_peer.py records reads it
      began=$SECONDS
      if [[ ! -f $build/$name.gguf ]]; then  # written once per machine, under another name until complete
        python3 bench/llamacpp_peer.py gguf --shape "$shape" --outtype "$type" --tree "$build/llama.cpp" \
          --out "$build/$name.part.gguf" > "$OUT/llamacpp/$name.gguf.log" 2>&1 \
          || { tail -5 "$OUT/llamacpp/$name.gguf.log"; exit 1; }
        mv "$build/$name.part.gguf" "$build/$name.gguf"
      fi
      "$build/out/bin/llama-bench" -m "$build/$name.gguf" -p 1024 -n 128 -d 0,1024 -ngl 99 -fa 1 -r 3 -o json \
        > "$build/$name.json" 2> "$OUT/llamacpp/$name.log"
      cp "$build/$name.json" "$OUT/llamacpp/$name.bench.json"
      echo "$shape $type: GGUF and llama-bench in $((SECONDS - began)) s"
    done
  done
  python3 bench/llamacpp_peer.py records --commit "${COMMIT:?set COMMIT}" --out "$OUT/llamacpp/results.json" \
    "$OUT"/llamacpp/*.bench.json ;;
*)
  echo "usage: bash bench/llamacpp.sh prepare | build | bench SHAPE..." >&2; exit 2 ;;
esac
