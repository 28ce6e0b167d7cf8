"""Hermes tool calls (Qwen2.5, SmolLM2, Hermes 2 Pro): ``<tool_call>{json}</tool_call>`` blocks
in ChatML turns that end with ``<|im_end|>``.

The parser behaves as vLLM's ``hermes`` parser: every block (a last unclosed one included) is
parsed as ``{"name": ..., "arguments": {...}}``; arguments are re-serialised as a JSON string;
``content`` is the text before the first ``<tool_call>`` or ``None`` when empty; if any block
fails to parse the whole text is returned as content and no tool call is reported.
"""

from __future__ import annotations

import json
import logging
import re

from mcprl_common.model_formats.base import (
    ExtractedToolCalls,
    ModelFormat,
    ToolParser,
    make_tool_call_id,
    register_model_format,
)
from mcprl_common.wire.tool_calls import FunctionCall, ToolCall

log = logging.getLogger(__name__)

START, END = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


class HermesToolParser(ToolParser):
    def extract_tool_calls(self, model_output: str) -> ExtractedToolCalls:
        if START not in model_output:
            return ExtractedToolCalls(tools_called=False, content=model_output)
        try:
            calls = []
            for closed, unclosed in _BLOCK.findall(model_output):
                raw = json.loads(closed if closed else unclosed)
                arguments = json.dumps(raw["arguments"], ensure_ascii=False)
                calls.append(ToolCall(id=make_tool_call_id(),
                                      function=FunctionCall(name=raw["name"], arguments=arguments)))
        except Exception as exc:  # malformed output is content, never an error
            log.debug("hermes tool call did not parse: %s", exc)
            return ExtractedToolCalls(tools_called=False, content=model_output)
        content = model_output[: model_output.find(START)]
        return ExtractedToolCalls(tools_called=True, tool_calls=calls, content=content or None)


HERMES = register_model_format(ModelFormat(
    name="hermes",
    parser=HermesToolParser,
    template_file="hermes.jinja",  # the Qwen2.5 template
    tool_call_start=START,
    tool_call_end=END,
    stop_tokens=("<|im_end|>",),
    template_default_system="You are a helpful assistant.",
))
