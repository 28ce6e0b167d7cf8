"""The GRPO update on 1 process vs N ranks (FSDP2), side by side in one run (JSON).

Both run the same step (``mcprl_trainer.dist_probe``: the plan rank 0 broadcasts, each rank
its whole micro-batches, gradients summed across ranks, AdamW on the shards) on the same
synthetic rollouts; the figure is rollout tokens (forward + backward) per second of the
optimizer step, the plan's broadcast included. ``max_param_diff`` says the N-rank step
moved the LoRA as the single process did.

CPU (gloo; ``--threads`` per rank, so 2 ranks x 1 thread use the cores 1 x 2 threads would)::

    python bench/bench_sharded_update.py --ranks 2 --threads 1

GPU (nccl, one GPU per rank; the goal is >= 1.8x at 2 GPUs, not measured yet)::

    python bench/bench_sharded_update.py --device cuda --ranks 2 \\
        --model models/smollm2-135m-instruct --samples 32 --seq 2048 --micro-batch-tokens 8192
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for sub in ("common/src", "inference/src", "trainer/src"):
    sys.path.insert(0, str(REPO / sub))

import torch  # noqa: E402

from mcprl_trainer.dist_probe import ProbeSpec, run_probe  # noqa: E402
from mcprl_trainer.grpo import TrainSample  # noqa: E402


def samples(n: int, seq: int, trained_frac: float, vocab: int, seed: int) -> list[TrainSample]:
    """Rollout-like rows: lengths seq/2..seq, the last ``trained_frac`` of each sampled."""

    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(seq // 2, seq)
        start = max(1, int(length * (1 - trained_frac)))
        ids = [rng.randrange(1, vocab) for _ in range(length)]
        mask = [0] * start + [1] * (length - start)
        old = [-rng.uniform(2.0, 8.0) if m else 0.0 for m in mask]
        out.append(TrainSample(ids, mask, old, (-1.0) ** i))
    return out


def summary(result: dict, tokens: int) -> dict:
    secs = result["step_seconds"]
    med = statistics.median(secs)
    return {"ranks": result["world_size"], "micro_batches_per_rank": result["rank_batches"],
            "step_seconds_median": round(med, 4), "step_seconds": [round(s, 4) for s in secs],
            "tokens_per_s": round(tokens / med, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(REPO / "models" / "tiny-test"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (nccl)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--trained-frac", type=float, default=0.3)
    ap.add_argument("--micro-batch-tokens", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(args.model).vocab_size
    rows = samples(args.samples, args.seq, args.trained_frac, vocab, args.seed)
    train = {"device": args.device, "micro_batch_tokens": args.micro_batch_tokens,
             "lr": 1e-4}
    spec = ProbeSpec(model=args.model, samples=rows, train=train, threads=args.threads,
                     repeats=args.repeats)
    tokens = sum(len(s.input_ids) for s in rows)
    with tempfile.TemporaryDirectory() as tmp:
        one = run_probe(spec, 1, Path(tmp))
        many = run_probe(spec, args.ranks, Path(tmp))
    diff = max(float((many["params"][k] - v).abs().max()) for k, v in one["params"].items())
    single, sharded = summary(one, tokens), summary(many, tokens)
    print(json.dumps({
        "bench": "sharded_update",
        "model": Path(args.model).name,
        "device": args.device,
        "backend": "nccl" if args.device.startswith("cuda") else "gloo",
        "threads_per_rank": args.threads,
        "samples": args.samples, "tokens_per_step": tokens,
        "micro_batch_tokens": args.micro_batch_tokens,
        "single": single, "sharded": sharded,
        "speedup": round(sharded["tokens_per_s"] / single["tokens_per_s"], 3),
        "max_param_diff": diff,
        "torch": torch.__version__, "cpu": platform.processor() or platform.machine(),
        "cpu_count": __import__("os").cpu_count(),
    }, indent=1))


if __name__ == "__main__":
    main()
