"""Model formats by name: chat template with tools, tool-call parser, stop tokens.

One registry for the engine and the trainer (a model's config names its format, default
``hermes``); importing this package registers the formats. A new family is one module here
with its parser and template, registered with :func:`register_model_format`.
"""

from mcprl_common.model_formats import hermes as _hermes  # noqa: F401 - registers "hermes"
from mcprl_common.model_formats.assistant import ParsedAssistant, ParsedCall, parse_assistant
from mcprl_common.model_formats.base import (
    ExtractedToolCalls,
    ModelFormat,
    ToolParser,
    get_model_format,
    get_tool_parser,
    make_tool_call_id,
    model_format_names,
    register_model_format,
)

DEFAULT_MODEL_FORMAT = "hermes"

__all__ = [
    "DEFAULT_MODEL_FORMAT",
    "ExtractedToolCalls",
    "ModelFormat",
    "ParsedAssistant",
    "ParsedCall",
    "ToolParser",
    "get_model_format",
    "get_tool_parser",
    "make_tool_call_id",
    "model_format_names",
    "parse_assistant",
    "register_model_format",
]
