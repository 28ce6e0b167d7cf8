"""The report's data: one detail payload and one small summary per step (and per eval), and
the index the page starts from, assembled from the summaries and the run's metrics.

Detail payloads are what the browser loads when a step is opened; summaries (a row of a few
numbers per rollout) let the page filter the whole run without loading every step.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from mcprl_trainer.html_report.views import rollout_view, scenario_view
from mcprl_trainer.run_files import read_jsonl

Kind = Literal["train", "eval"]
DATA_DIR = "report-data"
# Columns of a summary row, in this order (the page reads them by these names).
SUMMARY_COLUMNS = ("group", "member", "scenario", "reward", "advantage", "errors", "finish",
                   "queried", "success")


def data_name(kind: Kind, step: int, suffix: str) -> str:
    return f"{kind}-{step:04d}.{suffix}"


@dataclass
class StepData:
    detail: dict[str, Any]  # loaded by the page on demand
    summary: dict[str, Any]  # read back when the index is assembled


def step_data(kind: Kind, step: int, rows: list[dict[str, Any]], threshold: float) -> StepData:
    groups: dict[int, dict[str, Any]] = {}
    scenarios: dict[str, dict[str, Any]] = {}
    summary_rows = []
    for row in rows:
        gi = int(row.get("group", 0))
        group = groups.setdefault(gi, {"group": gi, "scenario_id": str(row.get("scenario_id")),
                                       "error": row.get("group_error"), "rollouts": []})
        row = {**row, "member": row.get("member", len(group["rollouts"]))}
        view = rollout_view(row, threshold)
        group["rollouts"].append(view)
        scenario = scenario_view(row.get("scenario") or {"id": row.get("scenario_id"),
                                                         "task": _task_of(row)})
        scenarios.setdefault(group["scenario_id"], scenario)
        summary_rows.append([gi, view["member"], group["scenario_id"], view["reward"],
                             view["advantage"], view["tool_errors"], view["finish"],
                             int(view["queried"]), int(view["success"])])
    detail = {"kind": kind, "step": step, "groups": [groups[k] for k in sorted(groups)]}
    summary = {"kind": kind, "step": step, "scenarios": scenarios, "rows": summary_rows}
    return StepData(detail, summary)


def _task_of(row: dict[str, Any]) -> str:
    """Rows written before the scenario was recorded: the task is the first user message."""

    for m in (row.get("trajectory") or {}).get("messages") or []:
        if m.get("role") == "user":
            return str(m.get("content") or "")
    return ""


def read_config(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "config.yaml"
    if not path.exists():
        return {}
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def success_threshold(config: dict[str, Any]) -> float:
    return float((config.get("eval") or {}).get("success_threshold", 1.0))


def _summaries(data_dir: Path, kind: Kind, steps: set[int]) -> list[dict[str, Any]]:
    out = []
    for path in sorted(data_dir.glob(f"{kind}-*.json")):
        summary = json.loads(path.read_text(encoding="utf-8"))
        if summary.get("step") in steps:
            out.append(summary)
    return sorted(out, key=lambda s: s["step"])


def _columns(summaries: list[dict[str, Any]], scenario_index: dict[str, int],
             finishes: list[str]) -> dict[str, Any]:
    cols: dict[str, list[Any]] = {"step": [], **{c: [] for c in SUMMARY_COLUMNS}}
    for summary in summaries:
        for row in summary["rows"]:
            cols["step"].append(summary["step"])
            for name, value in zip(SUMMARY_COLUMNS, row, strict=True):
                if name == "scenario":
                    value = scenario_index[value]
                elif name == "finish":
                    if value not in finishes:
                        finishes.append(value)
                    value = finishes.index(value)
                cols[name].append(value)
    return {"steps": [s["step"] for s in summaries], "cols": cols}


def build_index(run_dir: Path) -> dict[str, Any]:
    """Everything the page needs at load: run facts, metrics, evals, every rollout's summary."""

    config = read_config(run_dir)
    history = read_jsonl(run_dir / "metrics.jsonl")
    evals = read_jsonl(run_dir / "evals.jsonl")
    data_dir = run_dir / DATA_DIR
    train = _summaries(data_dir, "train", {int(h["step"]) for h in history})
    evals_seen = _summaries(data_dir, "eval", {int(e["step"]) for e in evals})
    scenarios: list[dict[str, Any]] = []
    scenario_index: dict[str, int] = {}
    for summary in train + evals_seen:
        for sid, view in summary["scenarios"].items():
            if sid not in scenario_index:
                scenario_index[sid] = len(scenarios)
                scenarios.append(view)
    finishes: list[str] = []
    return {
        "run": {"name": config.get("name", run_dir.name), "model": config.get("model"),
                "steps_planned": config.get("steps"),
                "steps_done": int(history[-1]["step"]) if history else 0,
                "group_size": config.get("group_size"),
                "groups_per_step": config.get("groups_per_step"),
                "reward_mode": (config.get("reward") or {}).get("mode"),
                "eval": config.get("eval") or {},
                "generated_at": time.strftime("%Y-%m-%d %H:%M:%S %Z")},
        "history": history,
        "evals": evals,
        "scenarios": scenarios,
        "train": _columns(train, scenario_index, finishes),
        "eval": _columns(evals_seen, scenario_index, finishes),
        "finishes": finishes,
        "data_dir": DATA_DIR,
    }
