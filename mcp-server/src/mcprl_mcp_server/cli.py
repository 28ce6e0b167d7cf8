"""``mcprl-mcp-server``: serve the company-db MCP server in the foreground.

Configuration comes from ``MCP_*`` environment variables (see settings.py); the flags
below override the most common ones.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from mcprl_common.service_app import run_service
from mcprl_mcp_server.app import SERVICE, create_app
from mcprl_mcp_server.db.seed import ensure_database
from mcprl_mcp_server.settings import McpServerSettings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mcprl-mcp-server", description=__doc__)
    parser.add_argument("--host", help="interface to bind (MCP_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (MCP_PORT, default 8903)")
    parser.add_argument("--db-path", type=Path, help="SQLite file (MCP_DB_PATH)")
    parser.add_argument("--preset", choices=["default", "tutorial"], help="MCP_DB_PRESET")
    parser.add_argument("--seed", type=int, help="MCP_DB_SEED")
    parser.add_argument(
        "--init-db", action="store_true", help="only create the database if missing, then exit"
    )
    args = parser.parse_args(argv)
    overrides = {
        key: value
        for key, value in {
            "host": args.host, "port": args.port, "db_path": args.db_path,
            "db_preset": args.preset, "db_seed": args.seed,
        }.items()
        if value is not None
    }  # fmt: skip
    settings = McpServerSettings(**overrides)
    if args.init_db:
        created = ensure_database(settings.db_path, settings.db_preset, settings.db_seed)
        print(f"{settings.db_path}: {'created' if created else 'exists, left unchanged'}")
        return
    app = create_app(settings)
    # FastMCP installs its own rich handler on "fastmcp"; route it to our JSON logs instead.
    fastmcp_log = logging.getLogger("fastmcp")
    fastmcp_log.handlers[:] = []
    fastmcp_log.propagate = True
    run_service(app, settings, SERVICE)


if __name__ == "__main__":
    main()
