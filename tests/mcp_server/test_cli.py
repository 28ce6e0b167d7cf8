"""The real entry point as a child process: settings from MCP_* env, DB created on first
start, JSON logs, both transports, graceful stop on SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fastmcp import Client

from mcprl_common.process import ServiceProcess, free_port
from mcprl_mcp_server.settings import McpServerSettings
from mcprl_testing.mcp_server import tool_json

pytestmark = pytest.mark.timeout(90)


async def test_entry_point_serves_both_transports(tmp_path: Path) -> None:
    port = free_port()
    db = tmp_path / "data" / "company.db"
    log = tmp_path / "server.log"
    env = {"MCP_PORT": str(port), "MCP_DB_PATH": str(db), "MCP_DB_PRESET": "tutorial"}
    proc = ServiceProcess("mcp-server", [sys.executable, "-m", "mcprl_mcp_server"], env=env,
                          health_url=f"http://127.0.0.1:{port}/healthz", log_path=log)  # fmt: skip
    with proc:
        assert db.exists()
        for path in ("/mcp", "/sse"):
            async with Client(f"http://127.0.0.1:{port}{path}", timeout=30) as client:
                sql = "SELECT COUNT(*) n FROM employees"
                res = await client.call_tool("run_query", {"sql": sql})
                assert tool_json(res)["results"] == [{"n": 15}]
        code = proc.stop()
    assert code in (0, -signal.SIGTERM)  # uvicorn re-raises SIGTERM after a clean shutdown
    lines = [json.loads(x) for x in log.read_text().splitlines() if x.startswith("{")]
    assert any(x.get("msg") == "database ready" and x.get("db_created") is True for x in lines)
    assert any(x.get("msg") == "Application shutdown complete." for x in lines)


def test_init_db_flag_and_settings_from_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "c.db"
    out = subprocess.run(
        [sys.executable, "-m", "mcprl_mcp_server", "--init-db", "--db-path", str(db)],
        capture_output=True, text=True, timeout=60, env={**os.environ},
    )  # fmt: skip
    assert out.returncode == 0 and "created" in out.stdout and db.exists()
    monkeypatch.setenv("MCP_ALLOWED_HOSTS", "mcp-server, *.internal")
    monkeypatch.setenv("MCP_AUTH_TOKEN", "")
    monkeypatch.setenv("MCP_QUERY_TIMEOUT_S", "2.5")
    settings = McpServerSettings()
    assert settings.allowed_hosts == ["mcp-server", "*.internal"]
    assert settings.auth_token is None
    assert settings.query_timeout_s == 2.5
    assert (settings.host, settings.port) == ("127.0.0.1", 8903)
    assert all(f.description for f in McpServerSettings.model_fields.values())
