"""Tool-call parsers: one class per model output format, found by name in a registry.

As vLLM's: a parser turns the decoded completion text into OpenAI ``tool_calls`` plus the
remaining ``content``. Parsing must never raise: text that does not parse comes back as content.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from mcprl_inference.api import ToolCall


def make_tool_call_id() -> str:
    """vLLM's id format for tool calls (``chatcmpl-tool-<32 hex>``)."""

    return f"chatcmpl-tool-{uuid.uuid4().hex}"


@dataclass
class ExtractedToolCalls:
    tools_called: bool
    tool_calls: list[ToolCall] = field(default_factory=list)
    content: str | None = None


class ToolParser(ABC):
    """Base of every parser; ``tokenizer`` is the model's (some formats need token ids)."""

    name: ClassVar[str] = ""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    @abstractmethod
    def extract_tool_calls(self, model_output: str) -> ExtractedToolCalls:
        """Split a finished completion into tool calls and content (never raises)."""


_REGISTRY: dict[str, type[ToolParser]] = {}


def register_tool_parser(name: str) -> Callable[[type[ToolParser]], type[ToolParser]]:
    def _register(cls: type[ToolParser]) -> type[ToolParser]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return _register


def get_tool_parser(name: str) -> type[ToolParser]:
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise ValueError(f"unknown tool-call parser {name!r} (known: {known})") from None


def tool_parser_names() -> list[str]:
    return sorted(_REGISTRY)
