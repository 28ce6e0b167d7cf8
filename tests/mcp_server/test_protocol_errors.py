"""Broken MCP traffic gets a protocol error and the server stays up: malformed JSON-RPC (not
JSON, invalid UTF-8, wrong types, deep nesting, a batch), an oversize message (announced or
chunked), garbage posted into an SSE session, and streams half-closed by the client in the
middle of a request or of an SSE session. Afterwards a real client still works and nothing
is left open (sessions, requests in flight)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastmcp import Client

from mcprl_mcp_server.app import MAX_MESSAGE_BYTES
from mcprl_mcp_server.loopback import serve_mcp
from mcprl_testing.mcp_server import file_sha256

pytestmark = [pytest.mark.faults, pytest.mark.timeout(120)]
HEADERS = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
MALFORMED = {
    "not json": b"this is not json",
    "invalid utf-8": b'{"jsonrpc": "2.0", "id": 1, "method": "\xff\xfe"}',
    "no method": b'{"jsonrpc": "2.0", "id": 1}',
    "wrong version": b'{"jsonrpc": "1.0", "id": 1, "method": "tools/list"}',
    "wrong types": b'{"jsonrpc": "2.0", "id": {}, "method": 5, "params": "x"}',
    "empty batch": b"[]",
    "batch": b'[{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}]',
    "deep": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "empty": b"",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    with serve_mcp(tmp_path_factory.mktemp("proto")) as served:
        yield served


def _base(url: str) -> str:
    return url.removesuffix("/mcp")


def _gauge(url: str, name: str) -> float:
    text = httpx.get(f"{_base(url)}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + " "))


def _assert_jsonrpc_error(resp: httpx.Response, what: str) -> None:
    assert 400 <= resp.status_code < 500, (what, resp.status_code, resp.text[:200])
    body = resp.json()
    assert body.get("jsonrpc") == "2.0" and body["error"]["code"] < 0, (what, body)
    assert body["error"]["message"], what


def _still_works(url: str) -> None:
    async def call() -> bool:
        async with Client(url, timeout=30) as client:
            return (await client.call_tool("list_tables", {})).is_error

    assert asyncio.run(call()) is False


def _settled(url: str) -> None:
    """No session or request left open by what the test did (polled: closing is async)."""

    deadline = time.monotonic() + 10
    while True:
        open_now = (_gauge(url, "mcprl_mcp_active_sessions"),
                    _gauge(url, "mcprl_mcp_requests_in_flight"))
        if open_now == (0.0, 0.0):
            return
        assert time.monotonic() < deadline, f"left open: sessions, in flight = {open_now}"
        time.sleep(0.05)


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_malformed_jsonrpc_gets_a_protocol_error(server, kind: str) -> None:
    url, db = server
    digest = file_sha256(db)
    resp = httpx.post(url, content=MALFORMED[kind], headers=HEADERS, timeout=10)
    _assert_jsonrpc_error(resp, kind)
    _still_works(url)
    assert file_sha256(db) == digest


def test_oversize_message_gets_a_protocol_error(server) -> None:
    url, _ = server
    sql = "SELECT 1 -- " + "x" * MAX_MESSAGE_BYTES
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": "run_query", "arguments": {"sql": sql}}}).encode()
    resp = httpx.post(url, content=body, headers=HEADERS, timeout=30)
    assert resp.status_code == 413
    _assert_jsonrpc_error(resp, "oversize")

    def chunked() -> Iterator[bytes]:
        for i in range(0, len(body), 64 * 1024):
            yield body[i:i + 64 * 1024]

    resp = httpx.post(url, content=chunked(), headers=HEADERS, timeout=30)
    assert resp.status_code == 413
    _assert_jsonrpc_error(resp, "oversize, chunked")
    _still_works(url)


def _sse_session(base: str) -> tuple[socket.socket, str]:
    """Open GET /sse on a raw socket; returns it and the session's message path."""

    sock = socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=10)
    sock.sendall(b"GET /sse HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n")
    data = b""
    while b"session_id=" not in data or not data.split(b"session_id=", 1)[1].count(b"\n"):
        chunk = sock.recv(4096)
        assert chunk, f"SSE stream closed early: {data!r}"
        data += chunk
    line = next(x for x in data.decode().splitlines() if "session_id=" in x)
    return sock, line.split("data:", 1)[1].strip()


def test_garbage_into_an_sse_session_is_refused(server) -> None:
    url, _ = server
    base = _base(url)
    sock, path = _sse_session(base)
    try:
        for body in (b"garbage", b'{"jsonrpc": "2.0", "id": 1}', b"\xff\xfe"):
            resp = httpx.post(base + path, content=body, headers=HEADERS, timeout=10)
            assert 400 <= resp.status_code < 500, (body, resp.status_code, resp.text)
        big = b'{"jsonrpc": "2.0", "id": 1, "method": "' + b"x" * MAX_MESSAGE_BYTES + b'"}'
        resp = httpx.post(base + path, content=big, headers=HEADERS, timeout=30)
        assert resp.status_code == 413
        _assert_jsonrpc_error(resp, "oversize into SSE")
    finally:
        sock.close()
    _still_works(f"{base}/sse")  # SSE clients are still served
    _settled(url)


def test_half_closed_request_and_sse_stream(server) -> None:
    url, db = server
    digest = file_sha256(db)
    base = _base(url)
    port = int(base.rsplit(":", 1)[1])
    # A request whose body stops half-way, the client's side shut: an answer or a close,
    # never a hang.
    for announced in (b"Content-Length: 4000\r\n", b"Transfer-Encoding: chunked\r\n"):
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        partial = b'{"jsonrpc": "2.0", "id": 1, "method": "tools/l'
        if announced.startswith(b"Transfer"):
            partial = f"{len(partial):x}\r\n".encode() + partial + b"\r\n"
        sock.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Accept: application/json, text/event-stream\r\n" + announced + b"\r\n"
                     + partial)
        sock.shutdown(socket.SHUT_WR)
        reply = b""
        try:
            while chunk := sock.recv(4096):
                reply += chunk
        finally:
            sock.close()
        assert reply == b"" or reply.startswith(b"HTTP/1.1 4"), reply[:200]
    # An SSE session whose client goes away without a word.
    sock, _ = _sse_session(base)
    sock.shutdown(socket.SHUT_WR)
    sock.close()
    _settled(url)
    _still_works(url)
    assert file_sha256(db) == digest
    assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
