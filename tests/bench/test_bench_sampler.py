"""bench/bench_sampler.py on the CPU, its fused arm under Triton's interpreter: both arms timed
beside the floor on the same logits, their tokens compared (the GPU figures come from a lent
GPU; see docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench" / "bench_sampler.py"


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU only: on CUDA the kernel runs "
                    "natively")
def test_every_arm_is_timed_on_the_same_logits() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu", "--batches", "2,3",
                           "--vocab", "500", "--reps", "1"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["bench"] == "sampler" and report["copy_bandwidth_gbps"] > 0
    assert [row["batch"] for row in report["rows"]] == [2, 3]
    for row in report["rows"]:
        assert set(row["arms"]) == {"torch", "fused:row", "fused"}
        assert all(arm["us"] > 0 for arm in row["arms"].values())
        assert row["tokens_differ"] == {"fused:row": 0, "fused": 0} and row["floor_us"] > 0


def test_without_triton_on_the_device_the_bench_says_so() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("TRITON_INTERPRET", None)
    proc = subprocess.run([sys.executable, str(BENCH), "--device", "cpu"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "needs Triton on CUDA" in proc.stderr
