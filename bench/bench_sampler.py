"""The sampler after a decode step, the torch path beside the fused kernel, in one run (JSON).

The arms run :func:`mcprl_inference.engine.sampling.sample` as the engine calls it after a
decode step (eagerly, its launches included) on the same float32 logits ``[B, V]`` (Qwen2.5's
vocabulary by default): ``torch`` is the dozen-kernel path, ``fused`` the two Triton kernels
of ``fuse`` kind ``sample`` (:mod:`mcprl_inference.engine.sampling_kernel`: the first pass
split into chunks of each row), ``fused:row`` the same with a program a row for that pass.
The requests are the trainer's (temperature 1, the top-1 log-prob). Figures are device time
per call (CUDA events around ``--reps`` calls); the floor is one read of the logits at the
copy bandwidth measured in the same run. Each fused arm's tokens are checked against torch's.

    python bench/bench_sampler.py --device cuda --batches 64,256
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "inference" / "src"))

import torch  # noqa: E402
from device_floor import copy_bandwidth, device_ms  # noqa: E402  (bench/, the script's own folder)
from model_shapes import QWEN25_3B  # noqa: E402

from mcprl_inference.engine import sampling_kernel  # noqa: E402
from mcprl_inference.engine.sampling import (  # noqa: E402
    SampleResult,
    SamplingBatch,
    SamplingParams,
    device_uniform,
    sample,
)


def bench_batch(batch: int, args: argparse.Namespace, device: torch.device,
                bandwidth: float) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(batch)
    logits = (torch.randn(batch, args.vocab, generator=gen) * 4).to(device)
    params = [SamplingParams(temperature=1.0, logprobs=1, seed=i) for i in range(batch)]
    sampling = SamplingBatch.build(params, list(range(batch)), device)
    steps = torch.zeros(batch, dtype=torch.long, device=device)

    def one_program_a_row() -> SampleResult:  # the fused kernel's first pass unsplit
        tokens, rows = sampling_kernel.sample_rows(
            logits, sampling.temperature, sampling.greedy, device_uniform(sampling.seeds, steps),
            unit_temperature=True, top1=True, chunks=1)
        return SampleResult(tokens, rows)

    arms = {"torch": lambda: sample(logits, sampling, steps),
            "fused:row": one_program_a_row,
            "fused": lambda: sample(logits, sampling, steps, fused=True)}
    floor_ms = logits.numel() * logits.element_size() / bandwidth * 1e3
    row: dict[str, Any] = {"batch": batch, "vocab": args.vocab,
                           "floor_us": round(floor_ms * 1e3, 2), "arms": {}}
    tokens = {}
    for name, fn in arms.items():
        tokens[name] = fn().tokens
        ms = device_ms(lambda fn=fn: fn().tokens, args.reps, device, graph=False)
        row["arms"][name] = {"us": round(ms * 1e3, 2), "share_of_floor": round(floor_ms / ms, 3)}
    row["tokens_differ"] = {name: int((tokens["torch"] != got).sum())
                            for name, got in tokens.items() if name != "torch"}
    row["fused_speedup"] = round(row["arms"]["torch"]["us"] / row["arms"]["fused"]["us"], 3)
    print(json.dumps({k: v for k, v in row.items() if k != "arms"} | {
        n: a["us"] for n, a in row["arms"].items()}), file=sys.stderr, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")],
                    default=[64, 256])
    ap.add_argument("--vocab", type=int, default=QWEN25_3B["vocab_size"])
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda needs a GPU (CPU: --device cpu with TRITON_INTERPRET=1)")
    if not sampling_kernel.available(device):
        ap.error("the fused arm needs Triton on CUDA (CPU: TRITON_INTERPRET=1)")
    bandwidth = copy_bandwidth(device)
    rows = [bench_batch(b, args, device, bandwidth) for b in args.batches]
    print(json.dumps({
        "bench": "sampler", "device": torch.cuda.get_device_name(device)
        if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "copy_bandwidth_gbps": round(bandwidth / 1e9, 1), "reps": args.reps,
        "block": sampling_kernel.BLOCK, "chunks": sampling_kernel.CHUNKS, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
