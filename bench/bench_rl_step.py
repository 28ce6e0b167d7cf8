"""One RL step, ours next to TRL's ``GRPOTrainer``, on the same GPU in one run (JSON).

The workload is the TRL anchor's (issue 15; docs/benchmarks.md "One RL step"): random weights
of Qwen2.5-3B's shape, 8 prompts x 8 rollouts, 512 random prompt ids, exactly 256 sampled
tokens (eos ignored), LoRA r=8 / alpha=16 on all linear layers, bf16, gradient checkpointing,
a cheap deterministic reward (bench/rl_step_common.py). ``--variant multiturn`` splits the
256 tokens over 4 turns with a 100-token tool result after each turn but the last.

Our step (bench/rl_step_ours.py): rollouts through our engine, its own process over HTTP,
rewards, the trainer's GRPO update, checkpoint, and the adapter published to the engine
(the next step samples from it). TRL's (bench/rl_step_trl.py): ``trl.GRPOTrainer`` with
transformers' generate. Each side runs ``--warmup`` steps, then ``--steps`` timed ones;
``seconds_per_step`` is the median of the timed steps; ``speedup`` is TRL's over ours.
Two warm-up steps by default: our step 1 samples from the base model and step 2 from the
first published adapter, whose LoRA key the engine meets (and captures CUDA graphs for) then;
TRL's step 2 already runs at its steady pace (docs/benchmarks.md, "two warm-up steps").
``--max-staleness both`` also runs our side overlapped (``ours_overlapped``,
``speedup_overlapped``): each step's update beside the next step's rollouts.

    python bench/bench_rl_step.py --device cuda --steps 5 --warmup 2     # the H200 run
    python bench/bench_rl_step.py --shape tiny --device cpu --steps 2 --warmup 1   # CPU smoke

On a GPU box the lead runs ``bench/device/rl_step.sh single|multi``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _src in ("bench", "common/src", "inference/src", "trainer/src"):
    if str(ROOT / _src) not in sys.path:
        sys.path.insert(1, str(ROOT / _src))

from rl_step_common import build_model_dir, workload_for  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", choices=["3b", "tiny"], default="3b",
                   help="3b: Qwen2.5-3B's shape, random bf16 weights; tiny: models/tiny-test")
    p.add_argument("--variant", choices=["single", "multiturn"], default="single")
    p.add_argument("--only", choices=["ours", "trl", "both"], default="both")
    p.add_argument("--steps", type=int, default=5, help="timed steps per side (after warm-up)")
    p.add_argument("--warmup", type=int, default=2,
                   help="steps per side before the timed ones (2: our first adapter's)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--prompts", type=int, default=None, help="prompts per step")
    p.add_argument("--rollouts", type=int, default=None, help="rollouts per prompt")
    p.add_argument("--prompt-tokens", type=int, default=None)
    p.add_argument("--new-tokens", type=int, default=None, help="sampled per rollout, all turns")
    p.add_argument("--micro-batch-tokens", type=int, default=None,
                   help="our update's padded tokens per micro-batch (default: 32768 on 3b, "
                        "as configs/qwen2.5-3b.yaml; 4096 on tiny)")
    p.add_argument("--gradient-checkpointing", choices=["on", "off"], default=None,
                   help="override the workload's (the anchor's: on at 3b); off trades memory "
                        "for the recomputed forward (pair it with --micro-batch-tokens)")
    p.add_argument("--shared-prefix", action="store_true",
                   help="our update runs each group's prompt once per micro-batch (needs "
                        "--gradient-checkpointing off; 8 x 768 = 6144 tokens hold a group)")
    p.add_argument("--liger-kernels", action="store_true",
                   help="our update with train.liger_kernels (CUDA: Liger's RMSNorm and SwiGLU "
                        "kernels); TRL's side keeps its default (off)")
    p.add_argument("--sync-checkpoint", action="store_true",
                   help="our step writes the whole checkpoint before publishing "
                        "(background_checkpoints: false; the default writes the adapter, "
                        "then the rest in the background)")
    p.add_argument("--max-staleness", choices=["0", "1", "both"], default="0",
                   help="1: our step k+1's rollouts are sampled (from adapter k-1) while step "
                        "k's update runs, as train.max_staleness: 1; the step's time is then "
                        "its wait for them plus reward, update and checkpoint. both: our side "
                        "twice, synchronous as 'ours', overlapped as 'ours_overlapped'")
    p.add_argument("--engine-profile", choices=["on", "off"], default="off",
                   help="on: the engine times each decode step's forward vs sampling on "
                        "CUDA (INFERENCE_PROFILE), which syncs every step and so keeps async "
                        "scheduling off; off (default): the engine as served")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads, of this process and the engine's")
    p.add_argument("--workdir", type=Path, default=None,
                   help="where the model folder and our run go (default: a temporary one)")
    p.add_argument("--out", type=Path, default=None,
                   help="also write the JSON here (rewritten after each side)")
    return p.parse_args(argv)


def versions() -> dict[str, str | None]:
    from importlib import metadata

    out: dict[str, str | None] = {}
    for name in ("torch", "transformers", "peft", "trl", "accelerate", "datasets"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def setup_info(device: str, work: Any) -> dict[str, Any]:
    import torch

    cuda = device.startswith("cuda")
    return {
        "device": device,
        "device_name": torch.cuda.get_device_name(torch.device(device)) if cuda
        else platform.processor() or platform.machine(),
        "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(), "python": platform.python_version(),
        "versions": versions(), "workload": work.describe(),
        # engine settings given from outside (e.g. INFERENCE_DECODE_ATTENTION=triton): our
        # engine process inherits them; none of them is a secret
        "engine_env": {k: v for k, v in sorted(os.environ.items())
                       if k in ("INFERENCE_FUSE", "INFERENCE_DECODE_ATTENTION",
                                "INFERENCE_CUDA_GRAPHS", "INFERENCE_LORA_MODE",
                                "INFERENCE_ASYNC_SCHEDULING",
                                "INFERENCE_SCHEDULER_DELAY_FACTOR")},
    }


def write(result: dict[str, Any], out: Path | None) -> None:
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if args.threads:  # the engine process inherits them
        os.environ.update({"OMP_NUM_THREADS": str(args.threads),
                           "MKL_NUM_THREADS": str(args.threads)})
    import torch
    from rl_step_ours import run_ours
    from rl_step_trl import run_trl, trl_available

    from mcprl_common.process import sigterm_as_interrupt

    sigterm_as_interrupt()  # a time limit's SIGTERM still stops the engine process
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    work = workload_for(args.shape, args.variant, prompts=args.prompts, rollouts=args.rollouts,
                        prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens,
                        gradient_checkpointing=None if args.gradient_checkpointing is None
                        else args.gradient_checkpointing == "on",
                        shared_prefix=args.shared_prefix or None,
                        liger_kernels=args.liger_kernels or None)
    micro = args.micro_batch_tokens or (32768 if args.shape == "3b" else 4096)
    tmp = tempfile.TemporaryDirectory(prefix="rl-step-") if args.workdir is None else None
    workdir = Path(tmp.name) if tmp is not None else args.workdir
    result: dict[str, Any] = {"bench": "one RL step: ours vs trl.GRPOTrainer",
                              "setup": setup_info(device, work), "ours": None, "trl": None}
    try:
        t0 = time.perf_counter()
        model_dir = build_model_dir(args.shape, workdir / f"model-{args.shape}", device)
        result["setup"]["model_build_seconds"] = round(time.perf_counter() - t0, 1)
        if args.only in ("ours", "both"):
            staleness = {"0": [0], "1": [1], "both": [0, 1]}[args.max_staleness]
            for max_staleness in staleness:
                side = "ours_overlapped" if max_staleness and len(staleness) > 1 else "ours"
                result[side] = run_ours(work, model_dir, device, args.steps, args.warmup,
                                        micro, workdir / side,
                                        background_checkpoints=not args.sync_checkpoint,
                                        max_staleness=max_staleness,
                                        engine_profile=args.engine_profile == "on")
                write(result, args.out)
        if args.only in ("trl", "both"):
            if trl_available():
                result["trl"] = run_trl(work, model_dir, device, args.steps, args.warmup)
            else:
                result["trl"] = {"skipped": "trl is not installed (make setup-trl)"}
    finally:
        if tmp is not None:
            tmp.cleanup()
    theirs = (result["trl"] or {}).get("seconds_per_step")
    for side, key in (("ours", "speedup"), ("ours_overlapped", "speedup_overlapped")):
        if side in result:
            ours = (result[side] or {}).get("seconds_per_step")
            result[key] = round(theirs / ours, 3) if ours and theirs else None
    write(result, args.out)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
