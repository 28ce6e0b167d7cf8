"""The tiny models: deterministic, Qwen2 architecture, Qwen2.5 chat format with tools."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig, AutoTokenizer

from mcprl_inference import tiny_model


def test_rebuild_is_bit_identical(tmp_path, tiny_test_model) -> None:
    rebuilt = tiny_model.build("tiny-test", tmp_path)
    ours = json.loads((tiny_test_model / "mcprl-tiny.json").read_text())
    theirs = json.loads((rebuilt / "mcprl-tiny.json").read_text())
    assert ours["fingerprint"] == theirs["fingerprint"]
    assert 500_000 < theirs["parameters"] < 2_000_000


def test_architecture_and_special_tokens(tiny_test_model) -> None:
    config = AutoConfig.from_pretrained(tiny_test_model)
    assert config.model_type == "qwen2" and config.tie_word_embeddings
    tok = AutoTokenizer.from_pretrained(tiny_test_model)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    for marker in ("<tool_call>", "</tool_call>", "<|im_start|>"):
        assert len(tok(marker, add_special_tokens=False)["input_ids"]) == 1, marker
    # digits are split one by one, as Qwen2's pre-tokenizer does
    assert tok.tokenize("2024") == ["2", "0", "2", "4"]


@pytest.mark.parametrize("with_tools", [True, False])
def test_chat_template_renders_tools_and_hermes_calls(tiny_test_model, with_tools) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_test_model)
    tools = [{"type": "function", "function": {"name": "run_query", "parameters": {
        "type": "object", "properties": {"sql": {"type": "string"}}}}}]
    messages = [
        {"role": "user", "content": "How many employees?"},
        {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
            "name": "run_query", "arguments": {"sql": "SELECT COUNT(*) FROM employees"}}}]},
        {"role": "tool", "content": '{"row_count": 1}', "tool_call_id": "c1"},
    ]
    text = tok.apply_chat_template(messages, tools=tools if with_tools else None,
                                   tokenize=False, add_generation_prompt=True)
    assert ('<tools>\n{"type": "function"' in text) is with_tools
    assert ('<tool_call>\n{"name": "run_query", "arguments": {"sql": "SELECT COUNT(*) FROM '
            'employees"}}\n</tool_call><|im_end|>\n') in text
    assert "<|im_start|>user\n<tool_response>\n{\"row_count\": 1}\n</tool_response>" in text
    assert text.endswith("<|im_start|>assistant\n")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text  # byte-level BPE round-trips exactly
