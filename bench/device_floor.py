"""The memory-bandwidth floor of a step, measured on the device the bench runs on, and the
device time of the work measured against it.

A decode step (or a decode attention kernel) is bound by the bytes it must read; its floor is
those bytes over what this device actually moves. A large device-to-device copy, counted as
read + write bytes, gives that rate in the same run: on the anchors' H200 it measured
4.24 TB/s (bench/anchors.json), so a figure taken on another card is never compared against
a different card's bandwidth.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device) -> float:
    """Bytes/s of a large device copy (read + write), the floor's bandwidth."""

    n = (1 << 28) if device.type == "cuda" else (1 << 24)
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    reps = 20 if device.type == "cuda" else 3
    t0 = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    sync(device)
    return 2 * n * reps / (time.perf_counter() - t0)


def device_ms(fn: Callable[[], Any], reps: int, device: torch.device, *,
              graph: bool = True) -> float:
    """Milliseconds per call of ``fn``. On CUDA, ``reps`` calls captured in one CUDA graph
    and replayed (no launch overhead), or with ``graph=False`` called eagerly between two
    CUDA events (launches included: work a graph cannot hold, e.g. a copy to pinned memory);
    wall time elsewhere. The first call (compiles, warm-up) is not timed."""

    fn()
    sync(device)
    if device.type != "cuda":
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps * 1e3
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    if not graph:
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        sync(device)
        return start.elapsed_time(end) / reps
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    captured = torch.cuda.CUDAGraph()
    with torch.cuda.graph(captured):
        for _ in range(reps):
            fn()
    captured.replay()
    sync(device)
    start.record()
    for _ in range(3):
        captured.replay()
    end.record()
    sync(device)
    return start.elapsed_time(end) / (3 * reps)
