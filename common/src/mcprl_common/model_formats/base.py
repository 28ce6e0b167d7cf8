"""A model format: how one family of models writes tool calls and where its turns stop.

The engine (its chat endpoint) and the trainer (its agent loop) must agree on what counts as
a tool call and on the chat template that taught the model to write them, so both look the
format up here by name. As vLLM's tool parsers: a parser turns the decoded completion text
into OpenAI ``tool_calls`` plus the remaining ``content``, and never raises.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, ClassVar

from mcprl_common.wire.tool_calls import ToolCall


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

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer

    @abstractmethod
    def extract_tool_calls(self, model_output: str) -> ExtractedToolCalls:
        """Split a finished completion into tool calls and content (never raises)."""


@dataclass(frozen=True)
class ModelFormat:
    """Everything about a model family's chat format that the engine and trainer share."""

    name: str
    parser: type[ToolParser]
    template_file: str  # under mcprl_common/model_formats/templates/
    tool_call_start: str  # the markers around one tool call in sampled text
    tool_call_end: str
    stop_tokens: tuple[str, ...]  # token strings that end an assistant turn
    template_default_system: str | None = None  # the template's system text when none is given

    def chat_template(self, default_system: str | None = None) -> str:
        """The Jinja chat template with tools; ``default_system`` replaces the template's own
        default system message (a model's template says its own name there)."""

        text = (resources.files("mcprl_common.model_formats") / "templates"
                / self.template_file).read_text(encoding="utf-8")
        if default_system is None:
            return text
        old = self.template_default_system
        if not old or text.count(old) != 2:
            raise RuntimeError(f"{self.template_file} changed: its default system message "
                               "is not found")
        return text.replace(old, default_system)

    def stop_token_ids(self, tokenizer: Any) -> list[int]:
        """The ids of ``stop_tokens`` in ``tokenizer``'s vocabulary (those it has)."""

        vocab = tokenizer.get_vocab()
        return [vocab[t] for t in self.stop_tokens if t in vocab]


_FORMATS: dict[str, ModelFormat] = {}


def register_model_format(fmt: ModelFormat) -> ModelFormat:
    fmt.parser.name = fmt.name
    _FORMATS[fmt.name] = fmt
    return fmt


def get_model_format(name: str) -> ModelFormat:
    try:
        return _FORMATS[name]
    except KeyError:
        known = ", ".join(sorted(_FORMATS)) or "none"
        raise ValueError(f"unknown model format {name!r} (known: {known})") from None


def model_format_names() -> list[str]:
    return sorted(_FORMATS)


def get_tool_parser(name: str) -> type[ToolParser]:
    """The tool-call parser of the format ``name`` (vLLM's ``--tool-call-parser``)."""

    return get_model_format(name).parser
