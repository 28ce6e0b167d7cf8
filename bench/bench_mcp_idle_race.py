"""Tool calls after an agent turn of about 5 s: how many fail as "Connection closed".

uvicorn closes a connection idle for 5 s (our services' old setting, and FastMCP's servers'
today); httpx keeps an idle connection for 5 s. A call sent on a pooled connection as the
server closed it fails, and the trainer retried the rollout (82 times in one GPU learning
run). Three arms side by side, each N concurrent MCP sessions (128) making calls (8) with an
idle gap drawn around 5 s (4.9-5.1 s) before each:

- ``server_5s_client_default``: a server with uvicorn's 5 s and fastmcp's default client;
- ``server_5s_client_ours``: the same server, the rollout's client
  (``mcprl_common.mcp_transport``: idle connections expire after 1 s);
- ``server_75s_client_default``: our MCP server as a process (``run_service``: 75 s) and
  fastmcp's default client.

Prints one JSON object: per arm the calls that succeeded and the sessions that failed, with
the first error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastmcp import Client

from mcprl_common.process import ServiceProcess, UvicornThread, free_port, wait_healthy
from mcprl_mcp_server.app import create_app
from mcprl_mcp_server.db.seed import ensure_database
from mcprl_mcp_server.settings import McpServerSettings
from mcprl_trainer.mcp_tools import open_session


async def default_session_calls(url: str, calls: int, gap: Callable[[], float]) -> int:
    async with Client(url, timeout=30) as client:
        for _ in range(calls):
            await asyncio.sleep(gap())
            await client.call_tool("list_tables", {})
        return calls


async def our_session_calls(url: str, calls: int, gap: Callable[[], float]) -> int:
    async with open_session(url, timeout_s=30) as session:
        for _ in range(calls):
            await asyncio.sleep(gap())
            if (await session.call("list_tables", {})).is_error:
                raise RuntimeError("list_tables failed")
        return calls


async def arm(url: str, ours: bool, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)

    def gap() -> float:
        return rng.uniform(args.gap_min_s, args.gap_max_s)

    run = our_session_calls if ours else default_session_calls
    start = time.monotonic()
    results = await asyncio.gather(*(run(url, args.calls, gap) for _ in range(args.sessions)),
                                   return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    return {"sessions": args.sessions, "calls_planned": args.sessions * args.calls,
            "sessions_ok": len(results) - len(failed), "sessions_failed": len(failed),
            "failure_share": round(len(failed) / len(results), 4),
            "first_error": (f"{type(failed[0]).__name__}: {str(failed[0])[:160]}"
                            if failed else None),
            "wall_s": round(time.monotonic() - start, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=128)
    parser.add_argument("--calls", type=int, default=8)
    parser.add_argument("--gap-min-s", type=float, default=4.9)
    parser.add_argument("--gap-max-s", type=float, default=5.1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    out: dict[str, Any] = {"bench": "mcp_idle_race", **vars(args)}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "company.db"
        ensure_database(db, "default", 42)
        settings = McpServerSettings(host="127.0.0.1", port=0, db_path=db)
        in_thread = UvicornThread(create_app(settings), keep_alive_s=5)  # uvicorn's default
        with in_thread:
            wait_healthy(f"{in_thread.url}/healthz", timeout_s=30)
            for name, ours in (("server_5s_client_default", False),
                               ("server_5s_client_ours", True)):
                out[name] = asyncio.run(arm(f"{in_thread.url}/mcp", ours, args))
                print(json.dumps({name: out[name]}), file=sys.stderr, flush=True)
        port = free_port()
        process = ServiceProcess(
            "mcp-server", [sys.executable, "-m", "mcprl_mcp_server"],
            env={"MCP_PORT": str(port), "MCP_DB_PATH": str(db), "MCP_LOG_LEVEL": "warning"},
            health_url=f"http://127.0.0.1:{port}/healthz", log_path=Path(tmp) / "server.log")
        with process:
            name = "server_75s_client_default"
            out[name] = asyncio.run(arm(f"http://127.0.0.1:{port}/mcp", False, args))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
