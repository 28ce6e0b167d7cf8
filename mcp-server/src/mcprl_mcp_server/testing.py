"""Helpers for tests of this and other services: a real company-db MCP server on loopback.

    from mcprl_mcp_server.testing import serve_mcp

    def test_something(tmp_path):
        with serve_mcp(tmp_path, preset="tutorial") as (mcp_url, db_path):
            ...  # fastmcp.Client(mcp_url) talks Streamable HTTP to a real server

The database is built before the server starts; the server runs in a background thread
(uvicorn, free 127.0.0.1 port) and is stopped when the block exits.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mcprl_common.process import UvicornThread, wait_healthy
from mcprl_mcp_server.app import create_app
from mcprl_mcp_server.db.seed import ensure_database
from mcprl_mcp_server.settings import Settings


@contextlib.contextmanager
def serve_mcp(
    tmp_path: Path, preset: str = "default", seed: int = 42, **settings: Any
) -> Iterator[tuple[str, Path]]:
    """Serve a fresh database under ``tmp_path``; yield (``http://127.0.0.1:PORT/mcp``, db path).

    Extra keyword arguments are :class:`~mcprl_mcp_server.settings.Settings` fields, e.g.
    ``query_timeout_s=0.5`` or ``auth_token="secret"``.
    """

    db_path = Path(tmp_path) / f"company-{preset}-{seed}.db"
    ensure_database(db_path, preset, seed)
    config = Settings(
        host="127.0.0.1", port=0, db_path=db_path, db_preset=preset, db_seed=seed, **settings
    )
    server = UvicornThread(create_app(config), host="127.0.0.1")
    with server:
        wait_healthy(f"{server.url}/healthz", timeout_s=30)
        yield f"{server.url}/mcp", db_path


def file_sha256(path: Path) -> str:
    """Checksum of a database file, to prove that nothing changed it."""

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_sql(db_path: Path, sql: str, params: tuple = ()) -> list[tuple]:
    """Read the database directly with sqlite3 (read-only): the reference for checks."""

    conn = sqlite3.connect(f"{Path(db_path).resolve().as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def tool_json(result: Any) -> Any:
    """The JSON in a successful tool result's text content (what an agent reads)."""

    if result.is_error:
        raise AssertionError(f"tool returned an error: {result.content}")
    return json.loads(result.content[0].text)


def tool_error(result: Any) -> str:
    """The message of a tool error (``isError``); fails if the call succeeded."""

    if not result.is_error:
        raise AssertionError(f"expected a tool error, got {result.content}")
    text = result.content[0].text
    if not text.strip():
        raise AssertionError("tool error without a message")
    return text
