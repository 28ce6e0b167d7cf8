"""A tiny model briefly fitted to answer with a Hermes tool call: the server parses it into
OpenAI ``tool_calls`` exactly as vLLM's hermes parser would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

TOOLS = [{"type": "function", "function": {
    "name": "run_query", "description": "Run a read-only SQL query.",
    "parameters": {"type": "object", "properties": {"sql": {"type": "string"}},
                   "required": ["sql"]}}}]
QUESTION = [{"role": "user", "content": "How many employees are there?"}]
CALL = {"name": "run_query", "arguments": {"sql": "SELECT COUNT(*) FROM employees"}}


@pytest.fixture(scope="module")
def fitted_model(tiny_test_model: Path, tmp_path_factory) -> Path:
    """Fit tiny-test on one chat sample ending in a <tool_call> (a few dozen AdamW steps)."""

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_test_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_test_model, dtype=torch.float32)
    prompt = tok.apply_chat_template(QUESTION, tools=TOOLS, add_generation_prompt=True,
                                     tokenize=False)
    answer = f"<tool_call>\n{json.dumps(CALL)}\n</tool_call><|im_end|>"
    p_ids = tok.encode(prompt, add_special_tokens=False)
    a_ids = tok.encode(answer, add_special_tokens=False)
    ids = torch.tensor([p_ids + a_ids])
    labels = ids.clone()
    labels[0, : len(p_ids)] = -100
    torch.manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(60):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.05, f"fit did not converge: {loss.item()}"
    out = tmp_path_factory.mktemp("fitted") / "tool-caller"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tool_server(fitted_model: Path, serve_factory):
    with serve_factory(fitted_model, served_model_name="tool-caller") as srv:
        yield srv


def _ask(tool_server, tool_choice: str):
    resp = tool_server.client.chat.completions.create(
        model="tool-caller", messages=QUESTION, tools=TOOLS, tool_choice=tool_choice,
        temperature=0.0, max_tokens=60)
    return resp.choices[0]


@pytest.mark.timeout(180)
def test_tool_call_is_parsed(tool_server) -> None:
    choice = _ask(tool_server, "auto")
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.id.startswith("chatcmpl-tool-") and call.type == "function"
    assert call.function.name == "run_query"
    assert json.loads(call.function.arguments) == CALL["arguments"]


@pytest.mark.timeout(60)
def test_tool_choice_none_returns_the_raw_text(tool_server) -> None:
    choice = _ask(tool_server, "none")
    assert choice.message.tool_calls == [] and choice.finish_reason == "stop"
    assert choice.message.content.startswith("<tool_call>")


@pytest.mark.timeout(60)
def test_truncated_call_is_content_not_an_error(tool_server) -> None:
    resp = tool_server.client.chat.completions.create(
        model="tool-caller", messages=QUESTION, tools=TOOLS, temperature=0.0, max_tokens=6)
    choice = resp.choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls == []
    assert choice.message.content.startswith("<tool_call>")
