"""The sql strategy on a SQL MCP server of another domain: schema-driven templates.

The server here is a small real FastMCP server over a real SQLite file (a library: authors,
books, loans) with the same three tool names as company-db but its own schema, and foreign
keys left undeclared (as in the tutorial's server) so they must be inferred.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastmcp import FastMCP

from mcprl_common.process import UvicornThread
from mcprl_scenario_gen.pipeline import run_generation
from mcprl_scenario_gen.store import ScenarioStore
from mcprl_scenario_gen.strategies import GenerationParams

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def _library(path: Path) -> None:
    con = sqlite3.connect(path)
    con.executescript("""
        CREATE TABLE authors (id INTEGER PRIMARY KEY, name TEXT, country TEXT);
        CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT, author_id INTEGER,
                            genre TEXT, pages INTEGER, price REAL);
        CREATE TABLE loans (id INTEGER PRIMARY KEY, book_id INTEGER, member TEXT, days INTEGER);
    """)
    countries = ["Chile", "Japan", "Nigeria", "Norway"]
    genres = ["poetry", "history", "fiction"]
    con.executemany("INSERT INTO authors VALUES (?, ?, ?)",
                    [(i, f"Author {chr(64 + i)}", countries[i % 4]) for i in range(1, 9)])
    con.executemany("INSERT INTO books VALUES (?, ?, ?, ?, ?, ?)",
                    [(i, f"Book {i:02d}", 1 + i % 8, genres[i % 3], 90 + 17 * i,
                      round(7.5 + 1.25 * i, 2)) for i in range(1, 31)])
    con.executemany("INSERT INTO loans VALUES (?, ?, ?, ?)",
                    [(i, 1 + (i * 7) % 30, f"member{i % 5}", 3 + i % 11) for i in range(1, 61)])
    con.commit()
    con.close()


def _server(db: Path) -> FastMCP:
    mcp = FastMCP("library")

    def query(sql: str) -> list[dict]:
        con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
        con.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in con.execute(sql).fetchall()]
        finally:
            con.close()

    @mcp.tool
    def list_tables() -> list[str]:
        """Tables of the library database."""
        return [r["name"] for r in query("SELECT name FROM sqlite_master WHERE type='table'")]

    @mcp.tool
    def describe_table(table_name: str) -> list[dict]:
        """Columns of one table (name, type, nullable, primary_key), tutorial-style."""
        return [{"name": r["name"], "type": r["type"], "nullable": not r["notnull"],
                 "primary_key": bool(r["pk"])}
                for r in query(f"PRAGMA table_info('{table_name}')")]

    @mcp.tool
    def run_query(sql: str) -> dict:
        """Run one SELECT."""
        rows = query(sql)
        return {"row_count": len(rows), "results": rows}

    return mcp


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    db = tmp_path_factory.mktemp("lib") / "library.db"
    _library(db)
    with UvicornThread(_server(db).http_app(path="/mcp")) as srv:
        yield f"{srv.url}/mcp", db


async def test_generic_templates_on_another_schema(library, settings) -> None:
    url, db = library
    store = ScenarioStore(settings.data_dir)
    manifest = await run_generation(
        GenerationParams(mcp_url=url, strategy="sql", n=40, seed=2, val_fraction=0.25,
                         holdout_entities=True),
        settings=settings, store=store)
    assert manifest.status == "succeeded", manifest.error
    items = store.load_split(manifest.id, "train") + store.load_split(manifest.id, "val")
    assert len(items) == 40
    templates = {s.template for s in items}
    assert all(t.startswith("g_") for t in templates) and len(templates) >= 7
    assert {"g_fk_count", "g_fk_sum"} <= templates  # joins through inferred foreign keys
    con = sqlite3.connect(db)
    for s in items:
        rows = con.execute(s.ground_truth.sql).fetchall()
        gt = s.ground_truth
        if gt.kind == "number":
            assert rows[0][0] == pytest.approx(gt.value, abs=0.01), s.task
        elif gt.kind == "list":
            assert [str(r[0]) for r in rows[: len(gt.value)]] == gt.value, s.task
        elif gt.kind == "set":
            assert sorted({str(r[0]) for r in rows}) == gt.value, s.task
        else:
            assert str(rows[0][0]) == gt.value, s.task
    con.close()
    train_entities = {e for s in store.load_split(manifest.id, "train") for e in s.entities}
    val_entities = {e for s in store.load_split(manifest.id, "val") for e in s.entities}
    assert not train_entities & val_entities
