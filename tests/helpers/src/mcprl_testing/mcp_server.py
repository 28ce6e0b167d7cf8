"""Checks for tests of the MCP server and its clients: read the database directly, read tool
results as an agent does. (The server itself: :func:`mcprl_mcp_server.loopback.serve_mcp`.)"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path
from typing import Any


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
