"""Trajectories: what an agent did in one rollout, as the judge and the trainer see it.

``messages`` are OpenAI chat messages (system, user, assistant with ``tool_calls``, tool
results), the shape ART's ``Trajectory.messages_and_choices`` serialises to.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

FinishReason = Literal[
    "completed",  # the agent called complete_task
    "max_turns",  # turn limit reached
    "context_exhausted",  # the next turn would not fit in the model's context
    "no_tool_call",  # the agent answered in plain text instead of calling a tool
    "error",  # infrastructure failure (engine or MCP server), not the agent's fault
]


class Trajectory(BaseModel):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    final_answer: str | None = None
    finish_reason: FinishReason = "completed"
    num_turns: int = Field(0, ge=0)
    tool_calls: int = Field(0, ge=0)
    tool_errors: int = Field(0, ge=0)
    malformed_tool_calls: int = Field(0, ge=0)
    metadata: dict[str, Any] = Field(default_factory=dict)
