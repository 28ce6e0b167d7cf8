"""The hermes model format: its parser behaves as vLLM's (calls, content before them, never a
crash), its template and stop tokens are the ones the engine and the trainer share."""

from __future__ import annotations

import json

import pytest

from mcprl_common.model_formats import (
    get_model_format,
    get_tool_parser,
    model_format_names,
    parse_assistant,
)


@pytest.fixture
def parser():
    return get_tool_parser("hermes")(tokenizer=None)


def test_plain_text_is_content(parser) -> None:
    out = parser.extract_tool_calls("There are 15 employees.")
    assert not out.tools_called and out.tool_calls == []
    assert out.content == "There are 15 employees."


def test_one_call_after_text(parser) -> None:
    text = ('Let me check.\n<tool_call>\n{"name": "run_query", "arguments": '
            '{"sql": "SELECT COUNT(*) FROM employees"}}\n</tool_call>')
    out = parser.extract_tool_calls(text)
    assert out.tools_called and len(out.tool_calls) == 1
    call = out.tool_calls[0]
    assert call.id.startswith("chatcmpl-tool-") and len(call.id) == len("chatcmpl-tool-") + 32
    assert call.type == "function" and call.function.name == "run_query"
    assert isinstance(call.function.arguments, str)
    assert json.loads(call.function.arguments) == {"sql": "SELECT COUNT(*) FROM employees"}
    assert out.content == "Let me check.\n"


def test_several_calls_and_no_content(parser) -> None:
    text = ('<tool_call>\n{"name": "list_tables", "arguments": {}}\n</tool_call>\n'
            '<tool_call>\n{"name": "describe_table", "arguments": {"table_name": "é"}}\n'
            '</tool_call>')
    out = parser.extract_tool_calls(text)
    assert [c.function.name for c in out.tool_calls] == ["list_tables", "describe_table"]
    assert out.tool_calls[1].function.arguments == '{"table_name": "é"}'  # ensure_ascii=False
    assert out.content is None
    assert len({c.id for c in out.tool_calls}) == 2


def test_unclosed_last_call_still_parses(parser) -> None:
    out = parser.extract_tool_calls('<tool_call>\n{"name": "list_tables", "arguments": {}}\n')
    assert out.tools_called and out.tool_calls[0].function.name == "list_tables"


@pytest.mark.parametrize("text", [
    "<tool_call>\n{not json}\n</tool_call>",
    '<tool_call>{"name": "x"}</tool_call>',  # no arguments: vLLM treats it as content
    "<tool_call>[1, 2]</tool_call>",
    '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
    '<tool_call>{"name": "ok", "arguments": {}}</tool_call><tool_call>{"name": </tool_call>',
])
def test_malformed_is_whole_text_as_content(parser, text: str) -> None:
    out = parser.extract_tool_calls(text)
    assert not out.tools_called and out.tool_calls == [] and out.content == text


def test_registry() -> None:
    assert "hermes" in model_format_names()
    assert get_tool_parser("hermes") is get_model_format("hermes").parser
    with pytest.raises(ValueError, match="unknown model format 'nope'"):
        get_tool_parser("nope")


def test_template_takes_the_model_default_system() -> None:
    fmt = get_model_format("hermes")
    plain = fmt.chat_template()
    assert "<tool_call>" in plain and "You are a helpful assistant." in plain
    mine = fmt.chat_template("I am SmolLM.")
    assert "I am SmolLM." in mine and "You are a helpful assistant." not in mine


def test_stop_tokens_are_found_in_the_vocab(tiny_test_model) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_test_model)
    assert get_model_format("hermes").stop_token_ids(tok) == [tok.eos_token_id]


def test_parse_assistant_tells_good_calls_from_malformed() -> None:
    text = ('Checking.\n<tool_call>\n{"name": "run_query", "arguments": {"sql": "SELECT 1"}}\n'
            '</tool_call>\n<tool_call>\n{"name": "run_query", "arguments": }\n</tool_call>')
    parsed = parse_assistant(text)
    assert parsed.content == "Checking."
    good, bad = parsed.calls
    assert good.name == "run_query" and good.arguments == {"sql": "SELECT 1"} and good.error is None
    assert bad.error is not None and bad.error.startswith("invalid JSON")
    assert parse_assistant("  just text ").content == "just text"
