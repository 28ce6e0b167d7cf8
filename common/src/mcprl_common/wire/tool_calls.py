"""OpenAI tool calls: what the engine returns and what a model format's parser produces."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class FunctionCall(BaseModel):
    model_config = ConfigDict(populate_by_name=True, protected_namespaces=())

    name: str
    arguments: str  # a JSON string, as OpenAI sends it


class ToolCall(BaseModel):
    model_config = ConfigDict(populate_by_name=True, protected_namespaces=())

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall
