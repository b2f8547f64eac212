"""bench/compare_commits.py: the before/after table of the default config from per-round results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))

import compare_commits  # noqa: E402


def write(folder: Path, side: str, round_: int, values: dict[tuple[str, str], float], commit: str) -> None:
    rows = [{"shape": shape, "variant": "default", "peer": None, "workload": workload, "value": value,
             "unit": "ms" if workload.startswith("prefill") else "tok/s",
             "roofline_fraction": None if workload.startswith("prefill") else value / 500, "commit": commit}
            for (shape, workload), value in values.items()]
    rows.append({**rows[0], "variant": "no-pdl", "value": 1.0})  # another variant: ignored
    (folder / f"{side}-{round_}").mkdir(parents=True)
    (folder / f"{side}-{round_}" / "results.json").write_text(json.dumps(rows))


def test_the_table_gives_each_round_the_medians_and_the_speed_ratio(tmp_path, capsys):
    for r, (decode_before, decode_after) in enumerate([(380.0, 390.0), (384.0, 386.0), (370.0, 392.0)], 1):
        write(tmp_path, "before", r, {("Qwen3-4B", "decode128_ctx1024"): decode_before,
                                      ("Qwen3-4B", "prefill1024"): 20.0}, "aaa1111")
        write(tmp_path, "after", r, {("Qwen3-4B", "decode128_ctx1024"): decode_after,
                                     ("Qwen3-4B", "prefill1024"): 16.0}, "bbb2222")
    records = tmp_path / "records.json"
    assert compare_commits.main([str(tmp_path), "--records", str(records)]) == 0
    out = capsys.readouterr().out
    assert compare_commits.main([str(records)]) == 0 and capsys.readouterr().out == out  # the same from the file
    assert len(json.loads(records.read_text())) == 12  # 2 sides x 3 rounds x 2 workloads, no other variant
    decode = next(line for line in out.splitlines() if "decode128_ctx1024" in line)
    assert "| 380, 384, 370 | 390, 386, 392 | 380 tok/s (76.0% of roofline) | 390 tok/s (78.0% of roofline) |" in decode
    assert decode.endswith(f"| x{390 / 380:.3f} |")
    prefill = next(line for line in out.splitlines() if "prefill1024" in line)
    assert prefill.endswith("| x1.250 |")  # 20 ms -> 16 ms is 1.25x the speed
    assert "before: aaa1111; after: bbb2222" in out


def test_no_rows_is_an_error_in_one_line(tmp_path, capsys):
    assert compare_commits.main([str(tmp_path)]) == 2
    assert capsys.readouterr().err.count("\n") == 1
