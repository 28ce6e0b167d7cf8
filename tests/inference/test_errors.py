"""Bad input gets a 4xx OpenAI-shaped error naming the problem, and the server stays healthy."""

from __future__ import annotations

import pytest

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _post(server, path: str, body: dict, status: int, needle: str) -> None:
    r = server.http.post(path, json={"model": server.model, **body})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and needle.lower() in err["message"].lower(), err


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("path", "body", "status", "needle"), [
    ("/v1/chat/completions", {**CHAT, "model": "nope"}, 404, "does not exist"),
    ("/v1/completions", {"prompt": [1, 2], "model": "nope"}, 404, "does not exist"),
    ("/v1/completions", {"prompt": list(range(10, 610))}, 400, "maximum context length"),
    ("/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 600}, 400, "maximum context length"),
    ("/v1/completions", {"prompt": [1, -5]}, 400, "out of vocabulary"),
    ("/v1/completions", {"prompt": [1, 10**6]}, 400, "out of vocabulary"),
    ("/v1/completions", {"prompt": []}, 400, "prompt"),
    ("/v1/completions", {"prompt": [[]]}, 400, "empty"),
    ("/v1/completions", {"prompt": [1, 2], "n": 0}, 400, "n"),
    ("/v1/chat/completions", {**CHAT, "n": 0}, 400, "n"),
    ("/v1/chat/completions", {**CHAT, "temperature": -1}, 400, "temperature"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 50}, 400, "logprobs"),
    ("/v1/chat/completions", {**CHAT, "stream": True}, 400, "stream"),
    # the types the OpenAPI document states, not what lax coercion would make of them
    # (a schemathesis run found `"top_logprobs": false` answered 200)
    ("/v1/chat/completions", {**CHAT, "top_logprobs": False}, 400, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "temperature": "0.5"}, 400, "temperature"),
    ("/v1/completions", {"prompt": [1, 2], "max_tokens": "3"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": [1, 2], "echo": 1}, 400, "echo"),
    ("/v1/chat/completions", {**CHAT, "tool_choice": "required"}, 400, "tool_choice"),
    ("/v1/chat/completions", {**CHAT, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     400, "schema"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema"}}, 400,
     "schema"),
    ("/v1/chat/completions", {**CHAT, "messages": [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function",
             "function": {"name": "f", "arguments": "{not json"}}]}]}, 400, "arguments"),
    ("/v1/chat/completions", {**CHAT, "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, "not supported"),
])
def test_bad_requests(server, path, body, status, needle) -> None:
    _post(server, path, body, status, needle)


@pytest.mark.timeout(60)
def test_invalid_json_and_server_still_healthy(server) -> None:
    r = server.http.post("/v1/chat/completions", content=b"{not json",
                         headers={"content-type": "application/json"})
    assert r.status_code == 400 and "json" in r.json()["error"]["message"].lower()
    r = server.http.post("/v1/completions", json={"model": server.model, "prompt": [1, "a"]})
    assert r.status_code == 400
    assert server.http.get("/health").status_code == 200
    assert server.http.get("/healthz").json()["status"] == "ok"
    ok = server.client.chat.completions.create(model=server.model,
                                               messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=3)
    assert ok.choices[0].message.content is not None
