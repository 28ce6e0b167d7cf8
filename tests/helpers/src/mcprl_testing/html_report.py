"""A made-up run directory, as the trainer leaves it, for the report's tests and for trying
the page at scale (``synthetic_run(root, steps=200, groups=8, group_size=8)``).

The rows go through the trainer's own writer (:func:`rollout_rows`), so they have the real
shape; only the agent's behaviour and the numbers are invented.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

from mcprl_common.wire import GroundTruth, Scenario, Trajectory
from mcprl_trainer.config import RunConfig, save_config
from mcprl_trainer.groups import ScoredGroup
from mcprl_trainer.records import RolloutResult, TokenRecord
from mcprl_trainer.run_files import (
    eval_rollouts_path,
    rollout_rows,
    train_rollouts_path,
    write_jsonl,
)


def _trajectory(rng: random.Random, task: str, error: bool, answer: str) -> Trajectory:
    sql = f"SELECT COUNT(*) FROM employees WHERE salary > {rng.randint(1, 9) * 10000}"
    result = ("Error: no such column: salary_usd. Columns of employees: id, name, salary"
              if error else json.dumps({"columns": ["n"], "rows": [[rng.randint(1, 150)]]}))
    calls = [("c1", "list_tables", {}), ("c2", "run_query", {"sql": sql}),
             ("c3", "complete_task", {"answer": answer})]
    tool_call = [{"id": i, "type": "function",
                  "function": {"name": n, "arguments": json.dumps(a)}} for i, n, a in calls]
    messages = [
        {"role": "system", "content": "You answer questions about the company database."},
        {"role": "user", "content": task},
        {"role": "assistant", "content": "Let me look at the tables.", "tool_calls": tool_call[:1]},
        {"role": "tool", "tool_call_id": "c1", "content": "departments, employees, projects, "
         "assignments " + "x" * rng.randint(200, 1500)},
        {"role": "assistant", "content": "", "tool_calls": tool_call[1:2]},
        {"role": "tool", "tool_call_id": "c2", "content": result},
        {"role": "assistant", "content": "", "tool_calls": tool_call[2:]},
    ]
    return Trajectory(messages=messages, final_answer=answer, finish_reason="completed",
                      num_turns=3, tool_calls=3, tool_errors=int(error),
                      metadata={"tool_error_ids": ["c2"] if error else []},
                      tools=[{"type": "function", "function": {"name": n}} for n in
                             ("list_tables", "describe_table", "run_query", "complete_task")])


def synthetic_run(root: Path, *, steps: int, groups: int, group_size: int,
                  evals: tuple[int, ...] = (), seed: int = 0) -> Path:
    """A run directory as the trainer leaves it, with made-up rollouts (same row writer)."""

    rng = random.Random(seed)
    config = RunConfig.model_validate({
        "name": "synthetic", "output_dir": str(root), "model": "tiny", "steps": steps,
        "group_size": group_size, "groups_per_step": groups,
        "scenarios": {"dir": str(root), "set_id": "synthetic"}, "reward": {"mode": "verifiable"}})
    run_dir = config.run_dir
    save_config(config, run_dir)
    pool = [Scenario(id=f"sc-{k:03d}", task=f"How many employees earn more than {k}0000?",
                     ground_truth=GroundTruth(kind="number", value=float(k)))
            for k in range(40)]

    def group(scenario: Scenario, size: int) -> ScoredGroup:
        results = []
        for _ in range(size):
            right = rng.random() < 0.4
            error = rng.random() < 0.2
            answer = str(scenario.ground_truth.value if right else rng.randint(0, 99))
            results.append(RolloutResult(
                scenario, _trajectory(rng, scenario.task, error, answer), TokenRecord([]),
                seconds=rng.uniform(0.5, 3.0), tool_errors=Counter(tool_error=int(error)),
                reward=float(right), components={"verifiable": float(right)},
                explanation="matches the ground truth" if right else "wrong number"))
        rewards = [r.reward for r in results]
        mean = sum(rewards) / len(rewards)
        for r in results:
            r.advantage = r.reward - mean
        return ScoredGroup(scenario, results)

    history = []
    for step in range(1, steps + 1):
        batch = [group(rng.choice(pool), group_size) for _ in range(groups)]
        write_jsonl(train_rollouts_path(run_dir, step), rollout_rows(step, batch))
        rewards = [r.reward for g in batch for r in g.results]
        history.append({"step": step, "reward_mean": sum(rewards) / len(rewards),
                        "reward_std": 0.45, "success_rate": sum(rewards) / len(rewards),
                        "tool_error_rate": 0.1, "kl": 0.001 * step, "clip_fraction": 0.02,
                        "rollout_seconds": 10.0, "judge_seconds": 0.5, "train_seconds": 5.0,
                        "publish_seconds": 0.2, "step_seconds": 16.0,
                        "rollout_tokens_per_s": 900.0, "train_tokens_per_s": 3000.0})
    write_jsonl(run_dir / "metrics.jsonl", history)
    rows = []
    for step in evals:
        batch = [group(s, 2) for s in pool[:6]]
        write_jsonl(eval_rollouts_path(run_dir, step), rollout_rows(step, batch))
        rewards = [r.reward for g in batch for r in g.results]
        rows.append({"step": step, "success_rate": sum(rewards) / len(rewards),
                     "mean_reward": sum(rewards) / len(rewards), "mean_turns": 3.0,
                     "tool_error_rate": 0.1, "n": len(rewards)})
    write_jsonl(run_dir / "evals.jsonl", rows)
    return run_dir
