"""A real company-db MCP server on loopback, in a background thread: for tests of this and
other services, and for tools that need one for a while (the ART parity check).

    from mcprl_mcp_server.loopback import serve_mcp

    with serve_mcp(tmp_path, preset="tutorial") as (mcp_url, db_path):
        ...  # fastmcp.Client(mcp_url) talks Streamable HTTP to a real server

The database is built before the server starts; the server runs in a background thread
(uvicorn, free 127.0.0.1 port) and is stopped when the block exits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mcprl_common.process import UvicornThread, wait_healthy
from mcprl_mcp_server.app import create_app
from mcprl_mcp_server.db.seed import ensure_database
from mcprl_mcp_server.settings import McpServerSettings


@contextlib.contextmanager
def serve_mcp(
    tmp_path: Path, preset: str = "default", seed: int = 42, **settings: Any
) -> Iterator[tuple[str, Path]]:
    """Serve a fresh database under ``tmp_path``; yield (``http://127.0.0.1:PORT/mcp``, db path).

    Extra keyword arguments are :class:`~mcprl_mcp_server.settings.McpServerSettings` fields, e.g.
    ``query_timeout_s=0.5`` or ``auth_token="secret"``.
    """

    db_path = Path(tmp_path) / f"company-{preset}-{seed}.db"
    ensure_database(db_path, preset, seed)
    config = McpServerSettings(
        host="127.0.0.1", port=0, db_path=db_path, db_preset=preset, db_seed=seed, **settings
    )
    server = UvicornThread(create_app(config), host="127.0.0.1")
    with server:
        wait_healthy(f"{server.url}/healthz", timeout_s=30)
        yield f"{server.url}/mcp", db_path
