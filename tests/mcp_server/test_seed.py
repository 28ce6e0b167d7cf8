"""The database content: the tutorial preset's exact rows, the default generator's realism
and determinism, atomic creation, and the CHECK-constraint reader."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from fastmcp import Client

from mcprl_mcp_server.db.schema import check_constraints
from mcprl_mcp_server.db.seed import ensure_database, generate, preset_data, write_database
from mcprl_mcp_server.loopback import serve_mcp
from mcprl_testing.mcp_server import file_sha256, read_sql, tool_json

pytestmark = pytest.mark.timeout(60)


async def test_tutorial_preset_has_exactly_5_15_8_rows(tmp_path: Path) -> None:
    with serve_mcp(tmp_path, preset="tutorial") as (url, db):
        async with Client(url, timeout=30) as client:
            counts = {
                t: tool_json(await client.call_tool("describe_table", {"table_name": t}))[
                    "row_count"
                ]
                for t in ("departments", "employees", "projects")
            }
    assert counts == {"departments": 5, "employees": 15, "projects": 8}
    names = [r[0] for r in read_sql(db, "SELECT name FROM departments ORDER BY id")]
    assert names == ["Engineering", "Marketing", "Data Science", "Sales", "Operations"]
    assert {r[0] for r in read_sql(db, "SELECT location FROM departments")} == {
        "San Francisco", "New York", "London"
    }  # fmt: skip
    (lo, hi), = read_sql(db, "SELECT MIN(salary), MAX(salary) FROM employees")  # fmt: skip
    assert (lo, hi) == (78_000, 175_000)
    assert {r[0] for r in read_sql(db, "SELECT status FROM projects")} == {
        "active", "completed", "on_hold"
    }  # fmt: skip


def test_generator_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    assert generate(42) == generate(42)
    assert generate(42) != generate(43)
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    write_database(a, generate(7))
    write_database(b, generate(7))
    dump = ["SELECT * FROM departments", "SELECT * FROM employees", "SELECT * FROM projects"]
    assert [read_sql(a, q) for q in dump] == [read_sql(b, q) for q in dump]


def test_default_preset_is_realistic() -> None:
    data = generate(42)
    assert (len(data.departments), len(data.employees), len(data.projects)) == (8, 150, 40)
    assert len({d[2] for d in data.departments}) >= 3  # several locations
    assert len({e[3] for e in data.employees}) >= 20  # many roles
    years = {int(e[5][:4]) for e in data.employees}
    assert max(years) - min(years) >= 8
    assert {p[4] for p in data.projects} == {"active", "completed", "on_hold"}
    assert any(p[3] is None for p in data.projects)  # some projects lack a lead
    dept_of = {e[0]: e[2] for e in data.employees}
    led = [p for p in data.projects if p[3] is not None]
    assert all(dept_of[p[3]] == p[2] for p in led)
    assert all(30_000 < e[4] < 400_000 for e in data.employees)
    assert len({e[1] for e in data.employees}) == 150  # unique names


def test_database_created_atomically_and_never_rewritten(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "company.db"
    assert ensure_database(path, "default", 42) is True
    assert sorted(p.name for p in path.parent.iterdir()) == ["company.db"]  # no temp left
    digest = file_sha256(path)
    assert ensure_database(path, "tutorial", 1) is False  # existing file wins, untouched
    assert file_sha256(path) == digest
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        conn.close()
    other = tmp_path / "other.db"
    other.write_bytes(b"")
    with pytest.raises(RuntimeError, match="lacks tables"):
        ensure_database(other)


def test_unknown_preset_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown preset"):
        preset_data("huge")


def test_check_constraint_reader() -> None:
    sql = (
        "CREATE TABLE t (a TEXT CHECK (a IN ('x)', 'y')), b INT check(b > (1 + 2)), "
        "c TEXT DEFAULT 'CHECK (no)', d INT, CONSTRAINT pos CHECK (d >= 0))"
    )
    assert check_constraints(sql) == ["a IN ('x)', 'y')", "b > (1 + 2)", "d >= 0"]
