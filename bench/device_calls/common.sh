# Sourced by the device call scripts here: set-up on the GPU machine and small helpers.
# D: details folder (tar'ed into $OUT/details.tgz by the caller); R: the H200 results folder.
set -u
export PYTHONUNBUFFERED=1
source bench/device.sh setup || exit 1
D=/tmp/details; mkdir -p $D
R=bench/results/NVIDIA-H200
log() { echo "[$(date +%T)] $*" | tee -a $OUT/probe.log; }
quiet() { grep -vE "it/s|s/it|row/s|Warning|warn" "$@"; }
variants() { for v in "$@"; do echo --variant $v; done; }
