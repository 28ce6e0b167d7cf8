"""Tool calls in sampled text, read with the engine's own Hermes parser.

The trainer and the engine must agree on what counts as a tool call, so the parser lives
once, in :mod:`mcprl_inference.tool_parsers`; this module only adapts its answer to what the
agent loop needs: the text content and, per ``<tool_call>`` block, either a call (name and
arguments) or why it is malformed (shown to the model as an error tool message).

The parser is all-or-nothing (one bad block makes the whole text content, as in vLLM), so
when it rejects a text that has ``<tool_call>`` blocks, each block is parsed on its own to
tell the good calls from the malformed ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from mcprl_inference.tool_parsers import ToolParser, get_tool_parser
from mcprl_inference.tool_parsers.hermes import END, START


@dataclass(frozen=True)
class ParsedCall:
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class ParsedAssistant:
    content: str
    calls: list[ParsedCall]


@lru_cache(maxsize=4)
def _parser(name: str) -> ToolParser:
    return get_tool_parser(name)(None)


def _why_malformed(inner: str) -> str:
    try:
        obj = json.loads(inner)
    except json.JSONDecodeError as exc:
        return f"invalid JSON ({exc.msg} at char {exc.pos})"
    if not isinstance(obj, dict) or "name" not in obj or "arguments" not in obj:
        return 'expected {"name": <tool name>, "arguments": {<arguments>}}'
    return "could not be parsed"


def _blocks(text: str) -> list[str]:
    """The inner text of each ``<tool_call>`` block (an unclosed last one included)."""

    return [part.split(END, 1)[0].strip() for part in text.split(START)[1:]]


def _to_call(tool_call: Any) -> ParsedCall:
    try:
        args = json.loads(tool_call.function.arguments or "{}")
    except json.JSONDecodeError:
        args = None
    if not isinstance(args, dict):
        return ParsedCall(tool_call.function.name, {}, "arguments must be a JSON object")
    return ParsedCall(tool_call.function.name, args)


def parse_assistant(text: str, parser: str = "hermes") -> ParsedAssistant:
    content = text.split(START, 1)[0].strip()
    if START not in text:
        return ParsedAssistant(text.strip(), [])
    p = _parser(parser)
    whole = p.extract_tool_calls(text)
    if whole.tools_called:
        return ParsedAssistant(content, [_to_call(c) for c in whole.tool_calls])
    calls: list[ParsedCall] = []
    for inner in _blocks(text):
        one = p.extract_tool_calls(f"{START}\n{inner}\n{END}")
        if one.tools_called and one.tool_calls:
            calls.append(_to_call(one.tool_calls[0]))
        else:
            calls.append(ParsedCall(error=_why_malformed(inner)))
    return ParsedAssistant(content, calls)
