#!/usr/bin/env bash
# The default config of two commits, measured in one device call: prefill of 1,024 tokens and decode
# of 128 tokens after 1,024, at both GPU shapes, each commit's own bench/run.py, alternating
# (A B A B ... for ROUNDS rounds) so that a drift of the machine shows as spread between rounds
# of one commit, not as a difference between the commits.
#
# Here, once per comparison: the other commit's package and harness into .ab/ (ignored by git):
#   mkdir -p .ab/before && git archive OLD core backends plugins configs 'bench/*.py' | tar -x -C .ab/before
# On the GPU (the working tree is the other side, "after"):
#   run(command="COMMIT=abc1234 BEFORE=a926bc4 bash bench/compare_commits.sh", carry=[".whl", ".ab"])
# Each side runs from a package folder made of its core/, backends/, plugins/ and configs/ (no
# install, so the two never mix). Every row comes back in one file, $OUT/ab/records.json (each with
# its side and round), with the table `python bench/compare_commits.py` prints from it
# ($OUT/ab/compare.md); each run's log is $OUT/ab/<side>-<round>.log.
# Environment: COMMIT, BEFORE (the commits' hashes, recorded), ROUNDS (default 2), SECONDS_PER_ROW
# (default 2), SHAPES (default "Qwen3-0.6B Qwen3-4B"), MODEL (a checkpoint folder instead of the
# random shapes, e.g. models/target: the shipped model, whose plain decoding is bound by the host's
# time per step), AB_S (seconds for the whole comparison, default 420).
set -u
export PYTHONUNBUFFERED=1
: "${OUT:?OUT: the folder whose files come back (set by the device tool)}"
[[ -n ${COMMIT:-} && -n ${BEFORE:-} ]] || { echo "error: set COMMIT and BEFORE (the two commits' hashes)" >&2; exit 2; }
[[ -f .ab/before/core/engine.py ]] || { echo "error: .ab/before holds no tileinfer tree (see the top of $0)" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1

package() {  # package TREE DIR: DIR/tileinfer laid out as pyproject.toml's package-dir maps it
  rm -rf "$2"; mkdir -p "$2/tileinfer"
  cp -r "$1/core/." "$2/tileinfer/"
  for sub in backends plugins configs; do cp -r "$1/$sub" "$2/tileinfer/$sub"; done
}
package .ab/before /tmp/ab/before
package . /tmp/ab/after
declare -A TREE=([before]=.ab/before [after]=.)
declare -A HASH=([before]=$BEFORE [after]=$COMMIT)
shapes=(); for s in ${SHAPES:-Qwen3-0.6B Qwen3-4B}; do shapes+=(--shape "$s"); done
[[ -n ${MODEL:-} ]] && shapes=(--model "$(realpath "$MODEL")")
deadline=$(( $(date +%s) + ${AB_S:-420} ))
for round in $(seq 1 "${ROUNDS:-2}"); do
  for side in before after; do
    left=$(( deadline - $(date +%s) )); (( left > 30 )) || { echo "ab: out of time before $side-$round"; break 2; }
    dir="/tmp/ab-runs/$side-$round"; mkdir -p "$dir" "$OUT/ab"
    echo "[$(date +%T)] $side round $round"
    PYTHONPATH=/tmp/ab/$side:/tmp/site timeout "$left" python3 "${TREE[$side]}/bench/run.py" --commit "${HASH[$side]}" \
      "${shapes[@]}" --variant default --workload prefill1024 --workload decode128_ctx1024 \
      --seconds "${SECONDS_PER_ROW:-2}" --no-peers --out "$dir" > "$OUT/ab/$side-$round.log" 2>&1
    echo "  exit $?"; grep -E "error|Error" "$OUT/ab/$side-$round.log" | tail -3
  done
done
python3 bench/compare_commits.py /tmp/ab-runs --records "$OUT/ab/records.json" | tee "$OUT/ab/compare.md"
