"""bench/bench_inference.py on the CPU: fused-kernel settings and decode attention kernels
side by side in one process, one engine each on its own copy of the model (what the
2026-12-06 H100 comparison had to run as two processes, before fusions were decided per
engine), and async scheduling off and on."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mcprl_inference.engine import fusions

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_fuse_settings_run_side_by_side() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_inference.py"), "--model",
         str(ROOT / "models" / "tiny-test"), "--engines", "ours,lora-unmerged", "--fuse",
         "none,norm+rotary,proj", "--decode-attention", "sdpa,matmul",
         "--async-scheduling", "off,on",
         "--batches", "2", "--prompt-len", "8", "--new-tokens", "4", "--threads", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=170)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["fuse"] == ["none", "norm+rotary", "proj"]
    (result,) = report["results"]
    assert result["fusions"] == []  # the first setting's engine: nothing fused
    (row,) = result["rows"]
    for key in ("ours", "fuse:norm+rotary", "fuse:proj", "attn:matmul", "async:on",
                "lora-unmerged", "lora-unmerged:fuse:proj"):  # a LoRA engine per fuse setting too
        assert row[key]["generated_tokens"] == 8 and row[key]["tokens_per_s"] > 0
        assert row[key]["first_run_tokens_per_s"] > 0  # each woke, ran twice, slept again
    assert row["fuse:norm+rotary"]["fusions"] == ["rms_norm x7", "rotary (torch.compile)"]
    assert row["fuse:proj"]["fusions"] == ["merged projections x6"]
    # the attention arm keeps the first fuse setting and runs its own kernel
    assert row["attn:matmul"]["fusions"] == [] and row["attn:matmul"]["decode_attention"] == \
        "matmul" and row["fuse:proj"]["decode_attention"] == "sdpa"
    assert row["async:on"]["async_scheduling"] is True
    assert row["fuse:proj"]["async_scheduling"] is False and report["async_scheduling"] == [
        "off", "on"]


def test_an_unknown_fuse_setting_is_refused() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_inference.py"), "--fuse", "norm,fast"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)
    kinds = ", ".join(fusions.KINDS)  # the message names every kind there is
    assert proc.returncode == 2 and f"fuse must be auto, none or kinds of {kinds} joined by " \
        "'+', got 'fast'" in proc.stderr


def test_an_unknown_decode_attention_kernel_is_refused() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_inference.py"), "--decode-attention",
         "sdpa,flash"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--decode-attention takes auto or sdpa, matmul, triton" \
        in proc.stderr
