"""Where a GPU step's time goes: device time per kernel class, from torch.profiler.

The benches call :func:`kernel_profile` around a few repetitions of one step (a decode step,
an update) to see which kernels the step's time is spent in, how many it launches, and how
much of its wall time the GPU is busy at all: the facts that choose the next lever (fewer
kernels, a better GEMM, a fused element-wise chain). Kernels are read from the profiler's
chrome trace (``cat == "kernel"``), the format that stays stable across torch versions, and
kernels replayed from CUDA graphs appear there as well.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# first match wins; names are cuBLAS/CUTLASS, PyTorch ATen and Triton (inductor) kernels
KERNEL_CLASSES: list[tuple[str, re.Pattern[str]]] = [
    ("attention", re.compile(r"fmha|flash|attention|attn", re.I)),
    ("gemm", re.compile(r"gemm|xmma|cutlass|cublas|nvjet|splitk|matmul|wgmma", re.I)),
    ("triton", re.compile(r"^triton", re.I)),
    ("softmax/norm/reduce", re.compile(r"softmax|norm|reduce|welford", re.I)),
    ("copy/index", re.compile(r"copy|cat|index|scatter|gather|memcpy|memset|fill|where", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled", re.I)),
]


def kernel_class(name: str) -> str:
    for label, pattern in KERNEL_CLASSES:
        if pattern.search(name):
            return label
    return "other"


def summarize(kernels: list[dict[str, Any]], reps: int, wall_s: float,
              top: int = 12) -> dict[str, Any]:
    """Per repetition: kernel count, summed device ms, busy share of the wall, classes, top."""

    total_us = sum(k["dur"] for k in kernels)
    spans = sorted((k["ts"], k["ts"] + k["dur"]) for k in kernels)
    busy_us, end = 0.0, float("-inf")
    for start, stop in spans:  # union of kernel intervals (streams may overlap)
        if stop > end:
            busy_us += stop - max(start, end)
            end = stop
    classes: dict[str, dict[str, float]] = {}
    names: dict[str, dict[str, float]] = {}
    for k in kernels:
        for table, key in ((classes, kernel_class(k["name"])), (names, k["name"])):
            row = table.setdefault(key, {"us": 0.0, "count": 0})
            row["us"] += k["dur"]
            row["count"] += 1

    def per_rep(row: dict[str, float]) -> dict[str, Any]:
        return {"ms": round(row["us"] / reps / 1000, 4), "count": round(row["count"] / reps, 1),
                "share": round(row["us"] / total_us, 3) if total_us else 0.0}

    ranked = sorted(names.items(), key=lambda kv: -kv[1]["us"])[:top]
    return {
        "reps": reps,
        "wall_ms": round(1000 * wall_s / reps, 3),
        "kernels": round(len(kernels) / reps, 1),
        "device_ms": round(total_us / reps / 1000, 3),
        "busy_share_of_wall": round(busy_us / (1e6 * wall_s), 3) if wall_s else None,
        "by_class": {c: per_rep(r) for c, r in sorted(classes.items(),
                                                      key=lambda kv: -kv[1]["us"])},
        "top": [{"name": n[:120], **per_rep(r)} for n, r in ranked],
    }


def kernel_profile(step: Callable[[], Any], reps: int = 5) -> dict[str, Any]:
    """Profile ``reps`` calls of ``step`` (already warmed up) on the current CUDA device."""

    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(reps):
            step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text()).get("traceEvents", [])
    kernels = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
               and "dur" in e]
    return summarize(kernels, reps, wall)
