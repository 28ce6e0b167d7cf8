"""The rollouts a run keeps beside its checkpoints, one JSONL file per step and per eval.

``rollouts/step-N.jsonl`` holds step N's training rollouts, ``rollouts/eval-step-N.jsonl``
the eval rollouts after step N (0 = before training). Each row carries what the run report
shows: the scenario (with its ground truth), the trajectory, the reward and its components,
the judge's explanation and the advantage. Files are written whole and moved into place, so a
reader (the report, or a crash) never sees half a file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from mcprl_common.files import atomic_write_bytes
from mcprl_trainer.groups import ScoredGroup

ROLLOUTS_DIR = "rollouts"


def train_rollouts_path(run_dir: Path, step: int) -> Path:
    return run_dir / ROLLOUTS_DIR / f"step-{step}.jsonl"


def eval_rollouts_path(run_dir: Path, step: int) -> Path:
    return run_dir / ROLLOUTS_DIR / f"eval-step-{step}.jsonl"


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def write_jsonl(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, default=str) + "\n" for r in rows))


def rollout_rows(step: int, groups: list[ScoredGroup]) -> list[dict[str, Any]]:
    """One row per rollout of ``groups`` (failed groups included, marked by ``group_error``)."""

    rows = []
    for gi, group in enumerate(groups):
        scenario = group.scenario.model_dump(mode="json")
        for mi, r in enumerate(group.results):
            rows.append({"step": step, "group": gi, "member": mi, "scenario_id": group.scenario.id,
                         "scenario": scenario, "reward": r.reward, "components": r.components,
                         "explanation": r.explanation, "advantage": r.advantage,
                         "group_error": group.error, "seconds": round(r.seconds, 3),
                         "policy_version": r.policy_version,
                         "trajectory": r.trajectory.model_dump(mode="json")})
    return rows


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file; a missing file has none."""

    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]
