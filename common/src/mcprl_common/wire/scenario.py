"""Scenarios: the tasks an agent practises on, shared by scenario-gen, judge and trainer.

The shape is a superset of ART's (``task``, ``difficulty``) so ART sets import as they are.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, Field

AnswerKind = Literal["number", "text", "set", "list"]
Split = Literal["train", "val"]


class GroundTruth(BaseModel):
    """A checkable answer, computed through the server's own tools (``sql`` strategy).

    ``number``: one numeric value, compared with ``rel_tol``/``abs_tol``;
    ``text``: one string, compared after normalisation;
    ``set``: names in any order; ``list``: names in this order (top-k questions).
    """

    kind: AnswerKind
    value: float | str | list[str] | list[float]
    rel_tol: float = Field(0.01, ge=0, description="Relative tolerance for numbers.")
    abs_tol: float = Field(0.01, ge=0, description="Absolute tolerance for numbers.")
    sql: str | None = Field(None, description="The query that produced the value, for audit.")


class Scenario(BaseModel):
    """One task. ``id`` is a stable content hash of the task text (see :meth:`content_id`)."""

    id: str
    task: str = Field(min_length=1)
    difficulty: int = Field(3, ge=1, le=5)
    split: Split | None = None
    strategy: str = "llm"
    ground_truth: GroundTruth | None = None
    template: str | None = Field(None, description="Template name for `sql` scenarios.")
    entities: list[str] = Field(default_factory=list, description="Entities the task names.")
    metadata: dict[str, Any] = Field(default_factory=dict)

    @staticmethod
    def content_id(task: str) -> str:
        norm = " ".join(task.lower().split())
        return "sc-" + hashlib.sha256(norm.encode()).hexdigest()[:16]

    def to_art(self) -> dict[str, Any]:
        """ART's ``MCPScenario``-style shape: task and difficulty."""

        return {"task": self.task, "difficulty": self.difficulty}

    @classmethod
    def from_art(cls, data: dict[str, Any], **extra: Any) -> Scenario:
        task = str(data["task"])
        return cls(id=cls.content_id(task), task=task,
                   difficulty=int(data.get("difficulty", 3)), **extra)


class ScenarioSetManifest(BaseModel):
    """What a stored scenario set was built from, so a run can be reproduced and audited."""

    id: str
    status: Literal["pending", "running", "succeeded", "failed", "cancelled"] = "pending"
    server_url: str
    tools_hash: str = ""
    strategy: str
    model: str | None = None
    seed: int = 0
    requested: int = 0
    counts: dict[str, int] = Field(default_factory=dict)
    difficulty_counts: dict[str, int] = Field(default_factory=dict)
    created_at: float = 0.0
    finished_at: float | None = None
    error: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)

    def fingerprint(self) -> str:
        return hashlib.sha256(json.dumps(self.params, sort_keys=True).encode()).hexdigest()[:12]
