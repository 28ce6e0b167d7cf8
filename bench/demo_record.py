"""Append one `make demo` run to a demo benchmark JSON (docs/bench/demo-cpu-<date>.json).

The demo's own report holds the evals; this adds what the table in docs/benchmarks.md shows
and the report does not: how many held-out rollouts ran the query, and each step's query rate
(the demo agent's habit is to answer without querying, so that rate is the decision RL fixes),
tool-error rate and gradient norm (what drifts late in a run).

    python bench/demo_record.py runs/demo-lora-s2/train/demo docs/bench/demo-cpu-2026-12-05.json \
        --name lora-seed2 --seed 2 --command "python -m mcprl_demo --set demo.seed=2 ..."
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from mcprl_trainer.html_report.views import queried

EVAL_KEYS = ("step", "n", "success_rate", "mean_turns", "tool_error_rate", "seconds")


def query_count(path: Path) -> tuple[int, int]:
    """Rollouts of a saved rollouts file that looked the answer up, and all of them."""

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sum(queried(r["trajectory"]) for r in rows), len(rows)


def record(run_dir: Path, name: str, seed: int, command: str,
           model: str | None = None) -> dict[str, Any]:
    report = json.loads((run_dir / "report.json").read_text())
    cfg = report["config"]
    train = cfg.get("train") or {}
    rollouts = run_dir / "rollouts"
    evals = {}
    for key in ("eval_before", "eval_after"):
        ev = report[key]
        evals[key] = {k: ev[k] for k in EVAL_KEYS}
        evals[key]["ran_the_query"] = query_count(rollouts / f"eval-step-{ev['step']}.jsonl")[0]
    steps = []
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    for m in metrics:
        queried, total = query_count(rollouts / f"step-{m['step']}.jsonl")
        steps.append({"step": m["step"], "train_success": round(m["success_rate"], 4),
                      "reward_mean": round(m["reward_mean"], 4),
                      "query_rate": round(queried / max(total, 1), 3),
                      "groups_trained": m["groups_trained"],
                      "tool_error_rate": round(m["tool_error_rate"], 3),
                      "grad_norm": round(m["grad_norm"], 3) if "grad_norm" in m else None,
                      "rollout_seconds": round(m["rollout_seconds"], 1),
                      "train_seconds": round(m["train_seconds"], 1),
                      "step_seconds": round(m["step_seconds"], 1)})
    gain = evals["eval_after"]["success_rate"] - evals["eval_before"]["success_rate"]
    return {"run": name, "command": command, "model": model or report["model"], "seed": seed,
            "steps_done": report["steps_done"],
            "rollout_temperature": (cfg.get("rollout") or {}).get("temperature"),
            "concurrency": (cfg.get("rollout") or {}).get("concurrency"),
            "groups_per_step": cfg.get("groups_per_step"), "group_size": cfg.get("group_size"),
            "optimizer": train.get("optimizer"), "lr": train.get("lr"),
            **evals, "gain_points": round(100 * gain, 1), "steps": steps}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path, help="the demo's trainer run (…/train/demo)")
    p.add_argument("json", type=Path, help="the benchmark JSON to append to")
    p.add_argument("--name", required=True)
    p.add_argument("--seed", type=int, required=True, help="demo.seed of the run")
    p.add_argument("--command", required=True, help="how the run was made, to re-run it")
    p.add_argument("--model", help="a readable name of the policy (default: the report's path)")
    args = p.parse_args()
    doc = json.loads(args.json.read_text())
    entry = record(args.run_dir, args.name, args.seed, args.command, args.model)
    names = [r["run"] for r in doc["runs"]]
    if args.name in names:  # recorded again (e.g. with more fields): keep its place
        doc["runs"][names.index(args.name)] = entry
    else:
        doc["runs"].insert(0, entry)
    args.json.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: entry[k] for k in ("run", "steps_done", "gain_points")}))


if __name__ == "__main__":
    main()
