"""Rollouts overlapped with the update (``train.max_staleness``) off vs on, side by side in one
run (JSON): seconds per step and the update loop's idle share.

Everything runs here, on loopback: the company MCP server, our engine and the judge
(verifiable rewards) as processes of a ``mcprl_stack.LocalStack``, and the trainer in this
process, once per mode with the same seed, scenarios and config. Per mode the JSON gives
``seconds_per_step`` (steps 2..N: step 1 has nothing to overlap with in either mode),
``update_idle_share`` (1 - update seconds / step seconds over those steps: on a GPU, the
share of the step the trainer's GPU waits; here the CPU stand-in), the mean wait for
rollouts and each step's staleness. Every group is trained on (``skip_zero_variance``
off), so each step's update costs the same whatever the rewards.

    .venv/bin/python bench/bench_overlap.py     # CPU, tiny-learn: ~6 min on 2 shared cores
    .venv/bin/python bench/bench_overlap.py --steps 6 --epochs 2     # a heavier update

On a CPU the engine and the update share the cores, so overlapping them saves less than
on a GPU, where the engine has its own GPU or the update leaves the shared one idle.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _src in ("common", "inference", "mcp-server", "scenario-gen", "judge", "trainer", "demo",
             "stack"):
    if str(ROOT / _src / "src") not in sys.path:
        sys.path.insert(1, str(ROOT / _src / "src"))

SERVICES = ["mcp-server", "inference", "judge"]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, default=ROOT / "models" / "tiny-learn")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--groups", type=int, default=2, help="scenarios per step")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=48, help="sampled tokens per turn")
    p.add_argument("--epochs", type=int, default=1, help="train.epochs_per_step")
    p.add_argument("--threads", type=int, default=1, help="torch threads, trainer and engine")
    p.add_argument("--scenarios", type=int, default=24)
    p.add_argument("--modes", default="0,1", help="max_staleness values, run in this order")
    p.add_argument("--out", type=Path, default=None, help="default: a temporary directory")
    return p.parse_args(argv)


def trainer_config(args: argparse.Namespace, urls: dict[str, str], served: str,
                   scenarios: Path, set_id: str, staleness: int) -> dict[str, Any]:
    return {
        "name": f"staleness-{staleness}", "seed": 0, "output_dir": str(args.out / "runs"),
        "model": str(args.model), "steps": args.steps, "group_size": args.group_size,
        "groups_per_step": args.groups, "save_rollouts": False,
        "policy": {"base_url": urls["engine"], "model": served},
        "mcp": {"url": urls["mcp"]}, "judge": {"url": urls["judge"]},
        "scenarios": {"dir": str(scenarios), "set_id": set_id},
        "reward": {"mode": "verifiable"},
        "rollout": {"max_turns": args.max_turns, "max_tokens_per_turn": args.max_tokens,
                    "min_tokens_per_turn": 8, "max_context": 4096, "concurrency": 8},
        "train": {"lr": 1e-4, "device": "cpu", "max_staleness": staleness,
                  "skip_zero_variance": False, "epochs_per_step": args.epochs},
        "eval": {"every": 0}, "status": {"enabled": False},
    }


def summarise(history: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    later = history[1:] or history  # step 1 overlaps nothing in either mode
    step_s = [h["step_seconds"] for h in later]
    train_s = sum(h["train_seconds"] for h in later)
    return {
        "seconds_per_step": round(sum(step_s) / len(step_s), 3),
        "seconds_per_step_median": round(statistics.median(step_s), 3),
        "update_idle_share": round(1.0 - train_s / sum(step_s), 3),
        "train_seconds_mean": round(train_s / len(later), 3),
        "rollout_seconds_mean": round(statistics.mean(h["rollout_seconds"] for h in later), 3),
        "rollout_wait_seconds_mean": round(
            statistics.mean(h["rollout_wait_seconds"] for h in later), 3),
        "staleness": [int(h["staleness"]) for h in history],
        "sampled_tokens": int(sum(h["sampled_tokens"] for h in history)),
        "wall_seconds": round(wall_s, 1),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    threads = str(args.threads)
    os.environ.update({"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
                       "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"})
    import torch

    from mcprl_demo.scenario_sets import generate_sql_set
    from mcprl_stack import LocalStack, StackSettings
    from mcprl_trainer.config import RunConfig
    from mcprl_trainer.trainer import Trainer

    torch.set_num_threads(args.threads)
    tmp = tempfile.TemporaryDirectory(prefix="bench-overlap-") if args.out is None else None
    args.out = Path(tmp.name) if tmp is not None else args.out
    args.out.mkdir(parents=True, exist_ok=True)
    stack = LocalStack(StackSettings(
        services=SERVICES, ports=dict.fromkeys(SERVICES, 0), runs_dir=args.out / "stack",
        model=str(args.model), inherit_env=False,
        env={"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
             "INFERENCE_LOG_LEVEL": "warning", "MCP_LOG_LEVEL": "warning",
             "JUDGE_LOG_LEVEL": "warning", "HF_HUB_OFFLINE": "1"}))
    stack.start()
    try:
        urls = {"engine": stack.urls["inference"] + "/v1", "judge": stack.urls["judge"],
                "mcp": stack.mcp_url or ""}
        served = stack.served_model or str(args.model)
        set_id = "bench-overlap"
        scenarios = args.out / "scenarios"
        train, _ = asyncio.run(generate_sql_set(urls["mcp"], scenarios / set_id,
                                                n=args.scenarios, seed=0, val_fraction=0.2))
        modes: dict[str, Any] = {}
        for staleness in (int(m) for m in args.modes.split(",")):
            config = RunConfig.model_validate(trainer_config(args, urls, served, scenarios,
                                                             set_id, staleness))
            started = time.perf_counter()
            trainer = Trainer(config)
            asyncio.run(trainer.run())
            modes[str(staleness)] = summarise(trainer.history, time.perf_counter() - started)
            print(f"max_staleness={staleness}: {modes[str(staleness)]}", file=sys.stderr)
    finally:
        stack.stop()
        if tmp is not None:
            tmp.cleanup()
    result: dict[str, Any] = {
        "bench": "rollouts overlapped with the update (train.max_staleness)",
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "torch_threads": args.threads},
        "workload": {"model": args.model.name, "steps": args.steps,
                     "rollouts_per_step": args.group_size * args.groups,
                     "max_turns": args.max_turns, "max_tokens_per_turn": args.max_tokens,
                     "epochs_per_step": args.epochs, "train_scenarios": len(train)},
        "off": modes.get("0"), "on": modes.get("1"),
    }
    if result["off"] and result["on"]:
        result["speedup"] = round(result["off"]["seconds_per_step"]
                                  / result["on"]["seconds_per_step"], 3)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
