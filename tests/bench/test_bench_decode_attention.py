"""bench/bench_decode_attention.py on the CPU, its split-K arms under Triton's interpreter:
every arm checked against float32 attention, the floor and the best arm reported (the GPU
figures come from a lent GPU; see docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "bench_decode_attention.py"
TINY = ["--device", "cpu", "--prompt-len", "20", "--new-tokens", "30", "--heads", "4",
        "--kv-heads", "2", "--head-dim", "16", "--reps", "2"]


@pytest.mark.timeout(120)
@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU only: the interpreter of the "
                    "GPU images' Triton differs; there the bench runs natively")
def test_every_arm_is_checked_and_timed_beside_the_floor() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(BENCH), *TINY, "--batches", "2,3",
                           "--configs", "16x4x2x4,32x4x2x1"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=110)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["bench"] == "decode_attention" and report["copy_bandwidth_gbps"] > 0
    assert [row["batch"] for row in report["rows"]] == [2, 3]
    for row in report["rows"]:
        assert set(row["arms"]) == {"sdpa", "split-k:16x4x2x4", "split-k:32x4x2x1",
                                    "kv:write+chunks+merge", "attn:one-kernel"}
        for arm in row["arms"].values():
            assert arm["max_error"] < 1e-4 and arm["us"] > 0 and arm["share_of_floor"] >= 0
        # the floor reads each row's own length: 2 (k, v) x kv heads x head dim x 4 bytes
        assert row["kv_bytes"] == round(row["mean_length"] * row["batch"]) * 2 * 2 * 16 * 4
        assert row["best"] in row["arms"] and row["best"].startswith("split-k:")


def test_a_malformed_config_is_refused() -> None:
    proc = subprocess.run([sys.executable, str(BENCH), *TINY, "--configs", "64x4x2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "block_n x num_warps x num_stages x programs_per_sm" \
        in proc.stderr
