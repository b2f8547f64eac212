"""tileinfer's benchmarks: one command, ``python -m bench COMMAND`` from the repository root.

Every benchmark appends its records (bench/records.py: one JSON line each, with its commit, date
and versions) to bench/results/<machine>/records.jsonl, or to --records FILE; ``python -m bench
report`` regenerates docs/performance.md from the stores, each table from the records of one commit.

On the GPU machine (the device tool: no network; carry .whl, made here once by ``bash
bench/device.sh wheels``), each call sets up and writes its records where they come back:

    source bench/device.sh setup && python3 -m bench matrix --part 1 --commit abc1234 --records "$OUT/records.jsonl"
    source bench/device.sh setup && python3 -m bench check steps --commit abc1234 --records "$OUT/records.jsonl"
    source bench/device.sh setup && python3 -m bench gpu-tests

and here, what came back joins the store and the tables: ``python -m bench report --add FILES/records.jsonl``.
The H200 matrix is parts 1 to 8 (``python -m bench matrix --list-parts``), one 10-minute call each.
"""
