"""/v1/chat/completions through the openai SDK: template, n, token ids, log-probs, JSON schema."""

from __future__ import annotations

import json

import jsonschema
import pytest

TOOLS = [{"type": "function", "function": {
    "name": "run_query", "description": "Run a read-only SQL query.",
    "parameters": {"type": "object", "properties": {"sql": {"type": "string"}},
                   "required": ["sql"]}}}]


@pytest.mark.timeout(60)
def test_prompt_is_the_chat_template_and_ids_come_back(server, tiny_tokenizer) -> None:
    messages = [{"role": "system", "content": "You query a company database."},
                {"role": "user", "content": "How many employees?"}]
    resp = server.client.chat.completions.create(
        model=server.model, messages=messages, tools=TOOLS, max_tokens=8, seed=1,
        extra_body={"return_token_ids": True})
    expected = tiny_tokenizer.apply_chat_template(messages, tools=TOOLS,
                                                  add_generation_prompt=True, tokenize=False)
    assert resp.model_extra["prompt_token_ids"] == tiny_tokenizer.encode(
        expected, add_special_tokens=False)
    choice = resp.choices[0]
    ids = choice.model_extra["token_ids"]
    assert 1 <= len(ids) <= 8 and resp.usage.completion_tokens == len(ids)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + len(ids)
    assert resp.id.startswith("chatcmpl-") and resp.object == "chat.completion"
    assert choice.finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.timeout(60)
def test_history_with_tool_calls_renders_like_vllm(server, tiny_tokenizer) -> None:
    """Assistant tool-call arguments sent as JSON strings are parsed to dicts before rendering."""

    call = {"id": "call_1", "type": "function",
            "function": {"name": "run_query", "arguments": '{"sql": "SELECT 1"}'}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "Count them."}]},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"row_count": 1}'}]
    resp = server.client.chat.completions.create(model=server.model, messages=messages,
                                                 tools=TOOLS, max_tokens=2,
                                                 extra_body={"return_token_ids": True})
    rendered = [{"role": "user", "content": "Count them."},
                {"role": "assistant", "content": "", "tool_calls": [
                    {**call, "function": {"name": "run_query",
                                          "arguments": {"sql": "SELECT 1"}}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"row_count": 1}'}]
    text = tiny_tokenizer.apply_chat_template(rendered, tools=TOOLS, add_generation_prompt=True,
                                              tokenize=False)
    assert '"arguments": {"sql": "SELECT 1"}' in text and "<tool_response>" in text
    assert resp.model_extra["prompt_token_ids"] == tiny_tokenizer.encode(
        text, add_special_tokens=False)


@pytest.mark.timeout(60)
def test_n_choices_logprobs_and_seed(server, ref_logprobs) -> None:
    messages = [{"role": "user", "content": "List the tables."}]

    def ask():
        return server.client.chat.completions.create(
            model=server.model, messages=messages, n=3, max_tokens=6, seed=9, logprobs=True,
            top_logprobs=2, extra_body={"return_token_ids": True, "ignore_eos": True})

    resp = ask()
    assert [c.index for c in resp.choices] == [0, 1, 2]
    prompt = resp.model_extra["prompt_token_ids"]
    seqs = [c.model_extra["token_ids"] for c in resp.choices]
    assert len({tuple(s) for s in seqs}) > 1, "n samples should differ"
    assert resp.usage.completion_tokens == sum(len(s) for s in seqs)
    for choice, ids in zip(resp.choices, seqs, strict=True):
        content = choice.logprobs.content
        assert len(content) == len(ids)
        assert all(len(e.top_logprobs) == 2 for e in content)
        assert [e.logprob for e in content] == pytest.approx(ref_logprobs(prompt, ids), abs=1e-4)
        assert all(bytes(e.bytes).decode("utf-8", "replace") == e.token for e in content)
    assert [c.model_extra["token_ids"] for c in ask().choices] == seqs  # same seed, same draws


SCHEMA = {"type": "object", "properties": {
    "answer": {"type": "integer"},
    "table": {"type": "string", "enum": ["employees", "departments", "projects"]},
    "ok": {"type": "boolean"}}, "required": ["answer", "table", "ok"],
    "additionalProperties": False}


@pytest.mark.timeout(120)
def test_json_schema_output_always_validates(server) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA,
                                                  "strict": True}}
    resp = server.client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "Answer in JSON."}],
        response_format=fmt, n=12, max_tokens=120, seed=0, temperature=1.0)
    assert len(resp.choices) == 12
    for choice in resp.choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    obj = server.client.chat.completions.create(
        model=server.model, messages=[{"role": "user", "content": "JSON please."}],
        response_format={"type": "json_object"}, n=4, max_tokens=120, seed=3)
    for choice in obj.choices:
        if choice.finish_reason == "stop":
            json.loads(choice.message.content)
