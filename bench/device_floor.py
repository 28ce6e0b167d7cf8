"""The memory-bandwidth floor of a step, measured on the device the bench runs on.

A decode step (or a decode attention kernel) is bound by the bytes it must read; its floor is
those bytes over what this device actually moves. A large device-to-device copy, counted as
read + write bytes, gives that rate in the same run: on the anchors' H200 it measured
4.24 TB/s (bench/anchors.json), so a figure taken on another card is never compared against
a different card's bandwidth.
"""

from __future__ import annotations

import time

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
