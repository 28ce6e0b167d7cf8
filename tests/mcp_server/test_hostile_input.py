"""Hostile input never changes the database: a corpus of write / DDL / PRAGMA / ATTACH /
multi-statement / injection / extension / temp-object attempts and a property-based test,
all through the real MCP client. Each gets a clear tool error; the file's checksum is the
same afterwards and the server stays healthy."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from fastmcp import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcprl_testing.mcp_server import file_sha256, read_sql, tool_error

pytestmark = pytest.mark.timeout(90)
READ_ONLY = "read-only: only SELECT/WITH queries are allowed"

REFUSED_AS_WRITE = [
    "INSERT INTO departments VALUES (99, 'Evil', 'Nowhere', 1)",
    "insert into employees select * from employees",
    "UPDATE employees SET salary = 0",
    "UPDATE employees SET salary = salary * 2 RETURNING id",
    "DELETE FROM projects",
    "REPLACE INTO departments VALUES (1, 'x', 'y', 1)",
    "WITH doomed AS (SELECT id FROM employees) DELETE FROM employees "
    "WHERE id IN (SELECT id FROM doomed)",
    "DROP TABLE employees",
    "DROP INDEX employees_department",
    "CREATE TABLE evil (x)",
    "CREATE TABLE copy AS SELECT * FROM employees",
    "ALTER TABLE employees ADD COLUMN bonus REAL",
    "ALTER TABLE projects RENAME TO p2",
    "CREATE INDEX evil ON employees(name)",
    "CREATE VIEW v AS SELECT 1",
    "CREATE TRIGGER t AFTER INSERT ON employees BEGIN SELECT 1; END",
    "CREATE VIRTUAL TABLE v USING fts5(x)",
    "CREATE TEMP TABLE t (x)",
    "CREATE TEMPORARY TABLE t AS SELECT * FROM employees",
    "CREATE TEMP VIEW v AS SELECT * FROM employees",
    "CREATE TEMP TRIGGER t AFTER DELETE ON employees BEGIN SELECT 1; END",
    "PRAGMA user_version = 7",
    "PRAGMA journal_mode = WAL",
    "PRAGMA query_only = OFF",
    "PRAGMA writable_schema = ON",
    "PRAGMA foreign_keys = OFF",
    "PRAGMA temp_store_directory = '/tmp'",
    "ATTACH DATABASE ':memory:' AS m",
    "ATTACH DATABASE '/tmp/mcprl-evil.db' AS evil",
    "DETACH DATABASE main",
    "VACUUM",
    "REINDEX",
    "ANALYZE",
    "BEGIN",
    "BEGIN IMMEDIATE",
    "COMMIT",
    "ROLLBACK",
    "SAVEPOINT s",
    "RELEASE s",
    "SELECT load_extension('/lib/x86_64-linux-gnu/libc.so.6')",
    "select LOAD_EXTENSION('x', 'entry')",
    "SELECT fts3_tokenizer('simple')",
]
REFUSED_OTHERWISE = [
    "SELECT 1; SELECT 2",
    "SELECT 1; DROP TABLE employees",
    "SELECT * FROM employees; DELETE FROM employees",
    "SELECT * FROM employees WHERE name = '' OR 1=1; DROP TABLE employees; --'",
    "SELECT 1 --\n; DELETE FROM employees",
    "SELECT * FROM employees /* ; */ ; UPDATE employees SET salary = 0",
    "SELECT 1\x00; DROP TABLE employees",
    "SELECT zeroblob(1000000000)",
    "SELECT randomblob(600000000)",
    "",
    "   \n\t",
    "SELECT " + " + ".join(["1"] * 12_000),
    "EXPLAIN DELETE FROM employees",
]


@pytest.fixture
def portal() -> Iterator[BlockingPortal]:
    with start_blocking_portal() as p:
        yield p


def _call(portal: BlockingPortal, client: Client, sql: str):  # type: ignore[no-untyped-def]
    return portal.call(lambda: client.call_tool("run_query", {"sql": sql}, raise_on_error=False))


def _healthy(url: str) -> None:
    base = url.removesuffix("/mcp")
    resp = httpx.get(f"{base}/healthz", timeout=5)
    assert resp.status_code == 200 and resp.json()["status"] == "ok"


def test_corpus_is_refused_and_changes_nothing(
    company_server: tuple[str, Path], portal: BlockingPortal, tmp_path: Path
) -> None:
    url, db = company_server
    before = file_sha256(db)
    vacuum_target = tmp_path / "stolen.db"
    corpus = [*REFUSED_AS_WRITE, f"VACUUM INTO '{vacuum_target}'"]
    with portal.wrap_async_context_manager(Client(url, timeout=30)) as client:
        for sql in corpus:
            msg = tool_error(_call(portal, client, sql))
            assert READ_ONLY in msg or "is not allowed" in msg, (sql, msg)
        for sql in REFUSED_OTHERWISE:
            msg = tool_error(_call(portal, client, sql))
            assert len(msg) > 10, (sql, msg)
        # The server still answers, and correctly.
        ok = _call(portal, client, "SELECT COUNT(*) AS n FROM employees")
        assert json.loads(ok.content[0].text)["results"] == [{"n": 150}]
    assert not vacuum_target.exists()
    assert not Path("/tmp/mcprl-evil.db").exists()
    assert file_sha256(db) == before
    assert read_sql(db, "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY 1") == [
        ("departments",), ("employees",), ("projects",)
    ]
    _healthy(url)


def test_messages_help_the_agent(company_server: tuple[str, Path], portal: BlockingPortal) -> None:
    url, _ = company_server
    with portal.wrap_async_context_manager(Client(url, timeout=30)) as client:
        msg = tool_error(_call(portal, client, "SELECT 1; SELECT 2"))
        assert "one statement" in msg
        msg = tool_error(_call(portal, client, "SELECT name FROM employes"))
        assert "no such table: employes" in msg and "employees" in msg
        msg = tool_error(_call(portal, client, "SELECT salry FROM employees"))
        assert "no such column: salry" in msg and "describe_table" in msg
        msg = tool_error(_call(portal, client, "SELECT name\nFROM employees\nWHER id = 1"))
        assert 'near "id"' in msg or 'near "WHER"' in msg
        assert "line 3" in msg and "^" in msg
        msg = tool_error(_call(portal, client, "DELETE FROM employees"))
        assert msg.startswith(READ_ONLY)
        msg = tool_error(_call(portal, client, "SELECT load_extension('x')"))
        assert "load_extension" in msg and "not allowed" in msg
        msg = tool_error(_call(portal, client, "-- just a comment"))
        assert msg.startswith("empty query")
        msg = tool_error(_call(portal, client, "SELECT name FROM employees WHERE id = ?"))
        assert "literals" in msg
        msg = tool_error(_call(portal, client, "SELECT * FROM pragma_table_info('employees')"))
        assert "describe_table" in msg


def test_read_only_pragmas_still_work(
    company_server: tuple[str, Path], portal: BlockingPortal
) -> None:
    url, _ = company_server
    with portal.wrap_async_context_manager(Client(url, timeout=30)) as client:
        res = json.loads(_call(portal, client, "PRAGMA table_info(projects)").content[0].text)
        assert "lead_id" in {r["name"] for r in res["results"]}


_WRITE_VERBS = ["INSERT INTO", "UPDATE", "DELETE FROM", "DROP TABLE", "CREATE TABLE",
                "ALTER TABLE", "ATTACH DATABASE", "PRAGMA", "CREATE TEMP TABLE", "VACUUM INTO",
                "REPLACE INTO", "CREATE INDEX x ON", "DETACH", "BEGIN;", "SAVEPOINT"]  # fmt: skip
_TABLES = ["employees", "departments", "projects", "sqlite_master", "main.employees", "'x.db'"]
_READS = ["SELECT 1", "SELECT * FROM employees", "WITH a AS (SELECT 1) SELECT * FROM a",
          "SELECT name FROM departments WHERE id = 1"]  # fmt: skip
_SEPARATORS = [";", "; ", ";\n", "; -- ", "/**/;", " ; ", "\n;\n"]
_SQLISH = st.text(alphabet=st.sampled_from(list("abcXYZ019 _;,'\"()*=-/\n%.")), max_size=40)
WRITE_ATTEMPTS = st.builds(
    lambda verb, table, tail: f"{verb} {table} {tail}",
    st.sampled_from(_WRITE_VERBS), st.sampled_from(_TABLES), _SQLISH,
)  # fmt: skip
STACKED = st.builds(
    lambda read, sep, write: f"{read}{sep}{write}",
    st.sampled_from(_READS), st.sampled_from(_SEPARATORS), WRITE_ATTEMPTS,
)  # fmt: skip
ANY_SQL = st.one_of(WRITE_ATTEMPTS, STACKED, st.text(max_size=120), _SQLISH)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(sqls=st.lists(ANY_SQL, min_size=1, max_size=3))
def test_property_no_input_changes_the_database(
    company_server: tuple[str, Path], sqls: list[str]
) -> None:
    url, db = company_server
    before = file_sha256(db)

    async def run_all() -> None:
        async with Client(url, timeout=30) as client:
            for sql in sqls:
                res = await client.call_tool("run_query", {"sql": sql}, raise_on_error=False)
                text = res.content[0].text
                if res.is_error:
                    assert text.strip()
                else:  # whatever got through must be a read with the full contract
                    body = json.loads(text)
                    assert set(body) == {"columns", "results", "row_count", "truncated",
                                         "elapsed_ms"}  # fmt: skip
                    assert body["row_count"] == len(body["results"])
                # A mere write verb followed by a table never succeeds.
                if sql.startswith(tuple(_WRITE_VERBS)) and not sql.startswith("PRAGMA"):
                    assert res.is_error, sql

    anyio.run(run_all)
    assert file_sha256(db) == before
    _healthy(url)
