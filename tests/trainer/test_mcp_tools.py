"""The trainer's MCP session against the real company server over Streamable HTTP: arguments
the client cannot send are the agent's mistake (a tool error it sees), not a dropped session
(which the rollout retries as the server's fault, 90 s at a time)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mcprl_mcp_server.loopback import serve_mcp
from mcprl_trainer.mcp_tools import open_session

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def mcp_url(tmp_path_factory: pytest.TempPathFactory):
    with serve_mcp(Path(tmp_path_factory.mktemp("mcp"))) as (url, _db):
        yield url


@pytest.mark.parametrize(("arguments", "why"), [
    (json.loads('{"sql": "SELECT \'\\ud83d\'"}'), "UnicodeEncodeError"),  # lone surrogate
    ("SELECT 1", "must be a JSON object, not str"),
    (["SELECT 1"], "must be a JSON object, not list"),
    ({"sql": float("nan")}, "ValueError"),
])
async def test_unsendable_arguments_are_a_tool_error_and_the_session_lives(
        mcp_url: str, arguments, why: str) -> None:
    async with open_session(mcp_url) as session:
        bad = await session.call("run_query", arguments)
        assert bad.is_error and bad.error_kind == "bad_arguments"
        assert bad.text.startswith("Error: the arguments of 'run_query' ") and why in bad.text
        good = await session.call("run_query", {"sql": "SELECT COUNT(*) AS n FROM employees"})
        assert not good.is_error and json.loads(good.text)["row_count"] == 1


async def test_no_arguments_mean_an_empty_object(mcp_url: str) -> None:
    async with open_session(mcp_url) as session:
        tables = await session.call("list_tables", None)
        assert not tables.is_error and "employees" in tables.text
        missing = await session.call("describe_table", None)
        assert missing.is_error and missing.error_kind == "bad_arguments"
        assert "table_name" in missing.text
