"""bench/bench_decode_gemm.py on the CPU at a shrunken shape: every projection of a decode step
timed in each arm beside its weight-read floor, each arm checked against float32 (the GPU
figures come from a lent GPU; see docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "bench_decode_gemm.py"


def test_each_projection_is_timed_beside_its_floor() -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--batches", "3,8",
                           "--scale", "0.05"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["bench"] == "decode_gemm" and report["copy_bandwidth_gbps"] > 0
    rows = report["rows"]
    assert [(r["batch"], r["projection"]) for r in rows] == [
        (b, p) for b in (3, 8) for p in ("qkv", "o", "gate_up", "down", "lm_head")]
    hidden = report["shape"]["hidden_size"]
    qkv = next(r for r in rows if r["projection"] == "qkv")
    assert qkv["bias"] and qkv["in_features"] == hidden and qkv["out_features"] > hidden
    for row in rows:
        assert set(row["arms"]) == {"linear", "swapped"}
        for arm in row["arms"].values():
            assert arm["max_error"] < 1e-3 and arm["us_per_call"] > 0
            assert arm["share_of_floor"] > 0
        assert row["floor_us_per_call"] > 0


def test_an_unknown_projection_is_refused() -> None:
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--projections",
                           "qkv,mlp"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown projections ['mlp']" in proc.stderr
