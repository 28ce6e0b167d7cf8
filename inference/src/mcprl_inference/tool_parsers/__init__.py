"""Tool-call parsers by name (``INFERENCE_TOOL_CALL_PARSER``); importing registers them."""

from mcprl_inference.tool_parsers import hermes as _hermes  # noqa: F401 - registers "hermes"
from mcprl_inference.tool_parsers.base import (
    ExtractedToolCalls,
    ToolParser,
    get_tool_parser,
    make_tool_call_id,
    register_tool_parser,
    tool_parser_names,
)

__all__ = [
    "ExtractedToolCalls",
    "ToolParser",
    "get_tool_parser",
    "make_tool_call_id",
    "register_tool_parser",
    "tool_parser_names",
]
