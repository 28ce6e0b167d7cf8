"""An assistant turn read the agent loop's way: its content and, per tool-call block, either a
call (name and arguments) or why it is malformed (shown to the model as an error tool message).

The format's parser is all-or-nothing (one bad block makes the whole text content, as in
vLLM), so when it rejects a text that has tool-call blocks, each block is parsed on its own to
tell the good calls from the malformed ones.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from mcprl_common.model_formats.base import ModelFormat, ToolParser, get_model_format


@dataclass(frozen=True)
class ParsedCall:
    name: str = ""
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class ParsedAssistant:
    content: str
    calls: list[ParsedCall]


@lru_cache(maxsize=8)
def _parser(name: str) -> ToolParser:
    return get_model_format(name).parser(None)


def _why_malformed(inner: str) -> str:
    try:
        obj = json.loads(inner)
    except json.JSONDecodeError as exc:
        return f"invalid JSON ({exc.msg} at char {exc.pos})"
    if not isinstance(obj, dict) or "name" not in obj or "arguments" not in obj:
        return 'expected {"name": <tool name>, "arguments": {<arguments>}}'
    return "could not be parsed"


def _blocks(text: str, start: str, end: str) -> list[str]:
    """The inner text of each tool-call block (an unclosed last one included)."""

    return [part.split(end, 1)[0].strip() for part in text.split(start)[1:]]


def _to_call(tool_call: Any) -> ParsedCall:
    try:
        args = json.loads(tool_call.function.arguments or "{}")
    except json.JSONDecodeError:
        args = None
    if not isinstance(args, dict):
        return ParsedCall(tool_call.function.name, {}, "arguments must be a JSON object")
    return ParsedCall(tool_call.function.name, args)


def parse_assistant(text: str, model_format: str | ModelFormat = "hermes") -> ParsedAssistant:
    fmt = get_model_format(model_format) if isinstance(model_format, str) else model_format
    start, end = fmt.tool_call_start, fmt.tool_call_end
    content = text.split(start, 1)[0].strip()
    if start not in text:
        return ParsedAssistant(text.strip(), [])
    p = _parser(fmt.name)
    whole = p.extract_tool_calls(text)
    if whole.tools_called:
        return ParsedAssistant(content, [_to_call(c) for c in whole.tool_calls])
    calls: list[ParsedCall] = []
    for inner in _blocks(text, start, end):
        one = p.extract_tool_calls(f"{start}\n{inner}\n{end}")
        if one.tools_called and one.tool_calls:
            calls.append(_to_call(one.tool_calls[0]))
        else:
            calls.append(ParsedCall(error=_why_malformed(inner)))
    return ParsedAssistant(content, calls)
