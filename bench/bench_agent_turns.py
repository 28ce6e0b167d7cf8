"""Multi-turn agent rollouts through our engine, prefix caching on vs off, side by side (JSON).

The workload is an agent's: ``--groups`` groups of ``--group-size`` rollouts, every rollout
starting with the same ``--system`` tokens (system prompt + tool schemas) and a task of its
group, then ``--turns`` turns; each turn samples ``--new-tokens`` tokens and appends a
``--tool-tokens``-token tool result before the next one. Turn k+1's prompt is exactly turn
k's prompt + its sampled ids + the tool result, as the trainer sends them. The same seeds
run with the cache on and off; the JSON gives wall seconds, prompt tokens prefilled, the
share served from the cache and rollouts/s (that both give the same log-probs is shown by
tests/inference/test_prefix_cache.py).

    python bench/bench_agent_turns.py --model models/smollm2-135m-instruct
    python bench/bench_agent_turns.py --device cuda --model models/smollm2-135m-instruct \\
        --groups 8 --group-size 8 --turns 4 --tool-tokens 100

Needs only torch + transformers (+ this repo's ``inference/src``, added here).
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "inference" / "src"))

import torch  # noqa: E402

from mcprl_inference.engine import EngineConfig, LLMEngine, SamplingParams  # noqa: E402


def rollout(engine: LLMEngine, start: list[int], args: argparse.Namespace, seed: int
            ) -> list[int]:
    """One agent rollout; returns every sampled id (for the on/off comparison)."""

    rng = random.Random(seed)
    span = _id_span(engine)
    prompt, sampled_all = list(start), []
    for turn in range(args.turns):
        out = engine.add_request(prompt, SamplingParams(
            max_tokens=args.new_tokens, temperature=1.0, seed=seed * 100 + turn,
            ignore_eos=True)).result(600)
        sampled = out.outputs[0].token_ids
        sampled_all += sampled
        tool = [rng.randrange(100, 100 + span) for _ in range(args.tool_tokens)]
        prompt = [*prompt, *sampled, *tool]
    return sampled_all


def _id_span(engine: LLMEngine) -> int:
    """Synthetic ids are 100..100 + span: 20,000 wide (as always) where the vocabulary
    allows, narrower for a tiny test model."""

    return min(20000, engine.vocab_size - 100)


def run(engine: LLMEngine, args: argparse.Namespace) -> dict[str, Any]:
    span = _id_span(engine)
    system = [(37 * i) % span + 100 for i in range(args.system)]
    starts = [[*system, *[(11 * g + j) % span + 100 for j in range(args.task_tokens)]]
              for g in range(args.groups) for _ in range(args.group_size)]
    stats = engine.stats
    before = (stats.prompt_tokens, engine.prefix_cache.hit_tokens,
              getattr(stats, "prefill_forwards", 0), stats.prefill_time_s, stats.prefill_batches,
              getattr(stats, "cached_prompt_tokens", 0))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(starts)) as pool:
        sampled = list(pool.map(lambda i: rollout(engine, starts[i], args, i), range(len(starts))))
    seconds = time.perf_counter() - t0
    prompt_tokens = engine.stats.prompt_tokens - before[0]
    hits = engine.prefix_cache.hit_tokens - before[1]
    if hasattr(stats, "cached_prompt_tokens"):  # cache hits + copies of equal prompts
        hits = stats.cached_prompt_tokens - before[5]
    return {"seconds": round(seconds, 3), "rollouts_per_s": round(len(starts) / seconds, 3),
            "prompt_tokens": prompt_tokens, "prefilled_tokens": prompt_tokens - hits,
            "cached_share": round(hits / prompt_tokens, 4) if prompt_tokens else 0.0,
            "generated_tokens": sum(len(s) for s in sampled),
            # older engines have no forward counter (it came with batched extends)
            "prefill_forwards": stats.prefill_forwards - before[2]
            if hasattr(stats, "prefill_forwards") else None,
            "prefill_batches": stats.prefill_batches - before[4],
            "prefill_s": round(stats.prefill_time_s - before[3], 3), "_sampled": sampled}


def bench_model(model: str, args: argparse.Namespace) -> dict[str, Any]:
    """The workload with the prefix cache off, then on, for one model."""

    results: dict[str, Any] = {"model": model}
    for name, on in (("cache_off", False), ("cache_on", True)):
        cfg = EngineConfig(device=args.device, dtype=args.dtype, max_batch_size=64,
                           enable_prefix_caching=on)
        engine = LLMEngine.from_pretrained(model, cfg).start()
        try:
            warm = argparse.Namespace(**{**vars(args), "turns": 1, "new_tokens": 2})
            rollout(engine, [1, 2, 3, 4], warm, 0)  # CUDA graphs, allocator, threads
            engine.prefix_cache.clear()
            results[name] = run(engine, args)
            results[name].pop("_sampled")  # ids differ at float-rounding ties: not compared
        finally:
            engine.shutdown()
    results["speedup"] = round(results["cache_off"]["seconds"] / results["cache_on"]["seconds"],
                               2)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", default=None,
                    help="model folder (repeat to compare models in one run; default SmolLM2)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--groups", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--system", type=int, default=800, help="shared start (tokens)")
    ap.add_argument("--task-tokens", type=int, default=30)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--tool-tokens", type=int, default=100)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    models = args.model or [str(REPO / "models" / "smollm2-135m-instruct")]
    rows = [bench_model(model, args) for model in models]
    out = {
        "bench": "agent_turns", "device": args.device, "host": platform.node(),
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "workload": {k: getattr(args, k) for k in ("groups", "group_size", "turns", "system",
                                                   "task_tokens", "new_tokens", "tool_tokens")},
        "models": rows,
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
