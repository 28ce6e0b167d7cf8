"""A decode step's GEMMs at the Qwen2.5-3B shape against the weight-read floor, in one run (JSON).

A decode step at batch 64 reads every weight once and does little arithmetic with it, so each
GEMM is bound by the bytes of its weight. The H100 profile (docs/benchmarks.md) had the
merged gate/up projection at 85% of the copy bandwidth but q/k/v and the output projection
at ~42%: their weights are small (10 and 8 MB a layer), so cuBLAS runs them on few tiles.
This bench times each projection of the engine's decode step (merged q/k/v with its bias,
o, merged gate/up, down, and the LM head) as the engine calls it (``F.linear``) beside other
ways to compute the same product:

- ``swapped``: ``(W @ x.T).T``, the same GEMM with the operands' roles exchanged, which
  cuBLAS tiles differently (the result is a transposed view);
- ``autotuned`` (``--autotune``): ``torch.compile(mode="max-autotune-no-cudagraphs")``,
  which times Triton's GEMM templates against cuBLAS and keeps the fastest.

Each arm runs the projection of all 36 layers (36 distinct weights: none stays in L2)
captured in one CUDA graph, as a decode step does; figures are per call. The floor is the
weight's bytes at the copy bandwidth measured in the same run.

    python bench/bench_decode_gemm.py --device cuda --batches 64,256 [--autotune]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from device_floor import copy_bandwidth, device_ms  # bench/, the script's own folder
from model_shapes import QWEN25_3B


def projections(shape: dict[str, Any]) -> dict[str, tuple[int, int, bool, int]]:
    """name -> (out features, in features, bias, calls a step) of a Qwen2 decode step."""

    hidden, inter = shape["hidden_size"], shape["intermediate_size"]
    head_dim = hidden // shape["num_attention_heads"]
    qkv = hidden + 2 * shape["num_key_value_heads"] * head_dim
    layers = shape["num_hidden_layers"]
    return {"qkv": (qkv, hidden, True, layers), "o": (hidden, hidden, False, layers),
            "gate_up": (2 * inter, hidden, False, layers), "down": (hidden, inter, False, layers),
            "lm_head": (shape["vocab_size"], hidden, False, 1)}




def bench_projection(name: str, out_f: int, in_f: int, bias: bool, calls: int, batch: int,
                     args: argparse.Namespace, device: torch.device, dtype: torch.dtype,
                     bandwidth: float) -> dict[str, Any]:
    gen = torch.Generator(device=device).manual_seed(batch)
    weights = [torch.randn(out_f, in_f, device=device, dtype=dtype, generator=gen) * 0.02
               for _ in range(calls)]
    biases = [torch.randn(out_f, device=device, dtype=dtype, generator=gen) if bias else None
              for _ in range(calls)]
    x = torch.randn(batch, in_f, device=device, dtype=dtype, generator=gen)
    want = [F.linear(x.float(), w.float(), None if b is None else b.float())
            for w, b in zip(weights[:2], biases[:2], strict=True)]

    def swapped(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        out = torch.mm(w, x.t()).t()
        return out if b is None else out + b

    arms: dict[str, Callable[..., torch.Tensor]] = {"linear": F.linear, "swapped": swapped}
    if args.autotune:
        arms["autotuned"] = torch.compile(F.linear, mode="max-autotune-no-cudagraphs",
                                          dynamic=False)
    floor_ms = calls * out_f * in_f * weights[0].element_size() / bandwidth * 1e3
    row: dict[str, Any] = {"projection": name, "batch": batch, "out_features": out_f,
                           "in_features": in_f, "bias": bias, "calls": calls,
                           "floor_us_per_call": round(floor_ms / calls * 1e3, 3), "arms": {}}
    for arm, fn in arms.items():
        try:
            error = max((fn(x, w, b).float() - ref).abs().max().item() for w, b, ref in zip(
                weights[:2], biases[:2], want, strict=True))
            ms = device_ms(lambda fn=fn: [fn(x, w, b) for w, b in zip(weights, biases,
                                                                      strict=True)], 5, device)
        except Exception as exc:  # an arm this device or torch cannot run: say so, go on
            row["arms"][arm] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        row["arms"][arm] = {"us_per_call": round(ms / calls * 1e3, 3),
                            "share_of_floor": round(floor_ms / ms, 3),
                            "max_error": round(error, 4)}
    print(json.dumps({"projection": name, "batch": batch} | {
        a: v.get("share_of_floor") for a, v in row["arms"].items()}), file=sys.stderr,
        flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")],
                    default=[64, 256])
    ap.add_argument("--projections", default="qkv,o,gate_up,down,lm_head",
                    help="comma-separated subset of qkv, o, gate_up, down, lm_head")
    ap.add_argument("--autotune", action="store_true",
                    help="add torch.compile max-autotune (minutes of compiling on a GPU)")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="shrink the model's widths (CPU tests)")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda needs a GPU")
    shape = dict(QWEN25_3B)
    if args.scale != 1.0:
        for key in ("hidden_size", "intermediate_size", "vocab_size"):
            shape[key] = max(64, int(shape[key] * args.scale) // 64 * 64)
        shape["num_hidden_layers"] = max(2, int(shape["num_hidden_layers"] * args.scale))
    table = projections(shape)
    wanted = [p.strip() for p in args.projections.split(",") if p.strip()]
    unknown = [p for p in wanted if p not in table]
    if unknown:
        ap.error(f"unknown projections {unknown}; choose from {', '.join(table)}")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = False
    bandwidth = copy_bandwidth(device)
    rows = [bench_projection(p, *table[p], batch, args, device, dtype, bandwidth)
            for batch in args.batches for p in wanted]
    print(json.dumps({
        "bench": "decode_gemm", "device": torch.cuda.get_device_name(device)
        if device.type == "cuda" else "cpu", "torch": torch.__version__,
        "dtype": str(dtype).removeprefix("torch."),
        "copy_bandwidth_gbps": round(bandwidth / 1e9, 1), "shape": shape, "rows": rows},
        indent=1))


if __name__ == "__main__":
    main()
