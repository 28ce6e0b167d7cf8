"""One decode step's attention, one layer at the Qwen2.5-3B shape, side by side in one run (JSON).

The arms: SDPA as the engine ran it before the split-K kernel (``kv_cache.slot_attention``:
an additive mask over a window rounded up to 256 positions), and the split-K Triton kernel
(``engine/decode_attention.py``) in each launch configuration of ``--configs``
(``block_n x num_warps x num_stages x programs_per_sm``), and the default configuration as a
layer of the engine runs it with the step's new K/V to write: the KV-write kernel, the
chunks and the merge kernel (``kv``, three launches) against the chunks writing the K/V and
merging themselves (``attn``, one launch). The floor is the KV the step must
read (each row's own length) at the device's copy bandwidth, measured in the same run. Each
arm is captured in a CUDA graph of ``--reps`` calls and replayed, so the figures are device
time without launch overhead; every arm's output is checked against float32 attention.

    python bench/bench_decode_attention.py --device cuda             # H100/H200: ~1 minute

On a CPU the split-K arms need Triton's interpreter (``TRITON_INTERPRET=1``, for the tests:
tiny shapes, seconds); the figures there mean nothing.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "inference" / "src"))

import torch  # noqa: E402
from device_floor import copy_bandwidth, device_ms  # noqa: E402  (bench/, the script's own folder)
from model_shapes import QWEN25_3B  # noqa: E402

from mcprl_inference.engine import decode_attention as split_k  # noqa: E402
from mcprl_inference.engine.kv_cache import set_decode_kernel, slot_attention  # noqa: E402

DEFAULT_CONFIGS = ("64x4x2x4,32x4x2x4,128x4x2x4,64x8x2x4,64x4x3x4,64x4x2x2,64x4x2x8,"
                   "128x8x3x4,32x2x2x8")


def parse_config(text: str) -> split_k.KernelConfig:
    try:
        block_n, warps, stages, per_sm = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"a config is block_n x num_warps x num_stages x programs_per_sm, e.g. 64x4x2x4; "
            f"got {text!r}") from None
    if block_n < 16 or block_n & (block_n - 1):
        raise argparse.ArgumentTypeError(f"block_n must be a power of two >= 16, got {block_n}")
    return split_k.KernelConfig(block_n, warps, stages, per_sm)




def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor
              ) -> torch.Tensor:
    """Float32 attention of each row over its own length, ``[B, 1, H, D]``."""

    window = k.shape[2]
    keys = torch.arange(window, device=q.device)
    scores = torch.einsum("bhgd,bhnd->bhgn", q.float(), k.float()) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(keys[None, None, None, :] >= lengths[:, None, None, None],
                                float("-inf"))
    out = torch.einsum("bhgn,bhnd->bhgd", torch.softmax(scores, -1), v.float())
    return out.reshape(q.shape[0], 1, -1, q.shape[-1])


def bench_batch(batch: int, args: argparse.Namespace, device: torch.device,
                configs: list[split_k.KernelConfig], bandwidth: float) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(batch)
    kv_heads, groups, dim = args.kv_heads, args.heads // args.kv_heads, args.head_dim
    max_len = args.prompt_len + args.new_tokens
    step = 256 if device.type == "cuda" else 64
    capacity = -(-(max_len + 16) // step) * step  # the engine's slot length for this request
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    lengths = torch.randint(args.prompt_len + 1, max_len + 1, (batch,), generator=gen)
    q = torch.randn(batch, kv_heads, groups, dim, generator=gen).to(device, dtype)
    cache = torch.randn(2, batch, kv_heads, capacity, dim, generator=gen).to(device, dtype)
    k, v = cache[0], cache[1]
    lengths_dev = lengths.to(device, torch.int32)
    want = reference(q, k, v, lengths.to(device))
    # SDPA as slot_attention ran a decode step: a window rounded up to `step`, additive mask
    window = min(-(-int(lengths.max()) // step) * step, capacity)
    allowed = torch.arange(window, device=device)[None, :] < lengths.to(device)[:, None]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(
        ~allowed, float("-inf"))[:, None, None, :]
    query = q.reshape(batch, kv_heads * groups, 1, dim)
    module = torch.nn.Module()

    def sdpa() -> torch.Tensor:
        return slot_attention(module, query, k[:, :, :window], v[:, :, :window], mask)[0]

    kv_bytes = int(lengths.sum()) * kv_heads * dim * 2 * cache.element_size()
    floor_ms = kv_bytes / bandwidth * 1e3
    row: dict[str, Any] = {"batch": batch, "capacity": capacity, "sdpa_window": window,
                           "mean_length": round(float(lengths.float().mean()), 1),
                           "kv_bytes": kv_bytes, "floor_ms": round(floor_ms, 5), "arms": {}}
    arms: dict[str, Any] = {"sdpa": sdpa}
    if split_k.available(device):
        for config in configs:
            name = (f"split-k:{config.block_n}x{config.num_warps}x{config.num_stages}"
                    f"x{config.programs_per_sm}")
            arms[name] = (lambda c=config: split_k.decode_attention(
                q, k, v, lengths_dev, dim**-0.5, config=c))
        # the step's own K/V (the values already at each row's last position: rewriting
        # them leaves the cache, and so the reference, as it was)
        last = (lengths_dev.long() - 1)[:, None, None, None].expand(batch, kv_heads, 1, dim)
        new_k, new_v = k.gather(2, last).contiguous(), v.gather(2, last).contiguous()
        positions = lengths_dev.long() - 1
        semaphores = torch.zeros(batch * kv_heads, dtype=torch.int32, device=device)

        def write_then_attend() -> torch.Tensor:
            split_k.write_decode_kv(cache, positions, new_k, new_v)
            return split_k.decode_attention(q, k, v, lengths_dev, dim**-0.5)

        arms["kv:write+chunks+merge"] = write_then_attend
        arms["attn:one-kernel"] = lambda: split_k.decode_attention(
            q, k, v, lengths_dev, dim**-0.5, new_kv=(new_k, new_v), one_kernel=True,
            semaphores=semaphores)
    for name, fn in arms.items():
        try:
            error = (fn().float() - want).abs().max().item()
            ms = device_ms(fn, args.reps, device)
        except Exception as exc:  # a configuration the compiler refuses: say so, go on
            row["arms"][name] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        row["arms"][name] = {"us": round(ms * 1e3, 2), "max_error": round(error, 5),
                             "share_of_floor": round(floor_ms / ms, 3)}
    timed = {n: a["us"] for n, a in row["arms"].items() if "us" in a}
    best = min((n for n in timed if n.startswith("split-k:")), key=timed.__getitem__,
               default=None)  # the best launch configuration
    row["best"] = best
    if best is not None:
        row["best_vs_sdpa"] = round(timed["sdpa"] / timed[best], 3)
    print(json.dumps({k: v for k, v in row.items() if k != "arms"} | {
        "us": timed}), file=sys.stderr, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")],
                    default=[16, 64, 256])
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=256,
                    help="each row's length is drawn in (prompt, prompt + new]")
    ap.add_argument("--heads", type=int, default=QWEN25_3B["num_attention_heads"])
    ap.add_argument("--kv-heads", type=int, default=QWEN25_3B["num_key_value_heads"])
    ap.add_argument("--head-dim", type=int,
                    default=QWEN25_3B["hidden_size"] // QWEN25_3B["num_attention_heads"])
    ap.add_argument("--configs", default=DEFAULT_CONFIGS,
                    type=lambda s: [parse_config(x) for x in s.split(",") if x.strip()])
    ap.add_argument("--reps", type=int, default=50, help="calls per timed graph")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda needs a GPU (CPU: --device cpu with TRITON_INTERPRET=1)")
    if args.heads % args.kv_heads:
        ap.error("--heads must be a multiple of --kv-heads")
    set_decode_kernel("sdpa")
    bandwidth = copy_bandwidth(device)
    rows = [bench_batch(b, args, device, args.configs, bandwidth) for b in args.batches]
    print(json.dumps({
        "bench": "decode_attention", "device": torch.cuda.get_device_name(device)
        if device.type == "cuda" else platform.processor() or platform.machine(),
        "torch": torch.__version__, "triton": getattr(split_k.triton, "__version__", None),
        "shape": {"heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim},
        "prompt_len": args.prompt_len, "new_tokens": args.new_tokens, "reps": args.reps,
        "copy_bandwidth_gbps": round(bandwidth / 1e9, 1),
        "default_config": dataclasses.asdict(split_k.DEFAULT_CONFIG),
        "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
