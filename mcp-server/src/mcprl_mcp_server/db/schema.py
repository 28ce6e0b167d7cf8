"""The company schema (the tutorial's three tables and columns, with real constraints) and
helpers that read a table's structure back out of SQLite for ``describe_table``."""

from __future__ import annotations

import sqlite3
from typing import Any

SCHEMA_VERSION = 1
TABLES = ("departments", "employees", "projects")
PROJECT_STATUSES = ("active", "completed", "on_hold")

SCHEMA_SQL = """
CREATE TABLE departments (
    id       INTEGER PRIMARY KEY,
    name     TEXT NOT NULL UNIQUE,
    location TEXT NOT NULL,
    budget   REAL NOT NULL CHECK (budget >= 0)
);
CREATE TABLE employees (
    id            INTEGER PRIMARY KEY,
    name          TEXT NOT NULL,
    department_id INTEGER NOT NULL REFERENCES departments(id),
    role          TEXT NOT NULL,
    salary        REAL NOT NULL CHECK (salary > 0),
    hire_date     TEXT NOT NULL CHECK (hire_date GLOB '[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]')
);
CREATE TABLE projects (
    id            INTEGER PRIMARY KEY,
    name          TEXT NOT NULL UNIQUE,
    department_id INTEGER NOT NULL REFERENCES departments(id),
    lead_id       INTEGER REFERENCES employees(id),
    status        TEXT NOT NULL CHECK (status IN ('active', 'completed', 'on_hold')),
    budget        REAL NOT NULL CHECK (budget >= 0)
);
CREATE INDEX employees_department ON employees(department_id);
CREATE INDEX projects_department ON projects(department_id);
CREATE INDEX projects_lead ON projects(lead_id);
"""


def user_tables(conn: sqlite3.Connection) -> list[str]:
    """Tables an agent may query, in creation order (SQLite's internal tables left out)."""

    rows = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
        "ORDER BY rowid"
    ).fetchall()
    return [r[0] for r in rows]


def check_constraints(create_sql: str) -> list[str]:
    """Every ``CHECK (...)`` expression of a CREATE TABLE statement, as written.

    SQLite keeps no catalog of CHECK constraints, so they are read from the stored DDL:
    find each CHECK keyword outside string literals and take its balanced parentheses.
    """

    checks: list[str] = []
    i, n = 0, len(create_sql)
    upper = create_sql.upper()
    while i < n:
        ch = create_sql[i]
        if ch in ("'", '"', "`"):
            i = _skip_quoted(create_sql, i)
            continue
        is_word_start = i == 0 or not (create_sql[i - 1].isalnum() or create_sql[i - 1] == "_")
        if is_word_start and upper.startswith("CHECK", i):
            j = i + 5
            while j < n and create_sql[j].isspace():
                j += 1
            if j < n and create_sql[j] == "(":
                end = _matching_paren(create_sql, j)
                checks.append(" ".join(create_sql[j + 1 : end].split()))
                i = end + 1
                continue
        i += 1
    return checks


def _skip_quoted(text: str, start: int) -> int:
    quote, i = text[start], start + 1
    while i < len(text):
        if text[i] == quote:
            if i + 1 < len(text) and text[i + 1] == quote:  # doubled quote is an escape
                i += 2
                continue
            return i + 1
        i += 1
    return len(text)


def _matching_paren(text: str, open_at: int) -> int:
    depth, i = 0, open_at
    while i < len(text):
        ch = text[i]
        if ch in ("'", '"', "`"):
            i = _skip_quoted(text, i)
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return len(text) - 1


def describe(conn: sqlite3.Connection, table: str) -> dict[str, Any]:
    """Columns, foreign keys, CHECK constraints and row count of one (existing) table."""

    quoted = '"' + table.replace('"', '""') + '"'
    columns = [
        {
            "name": name,
            "type": col_type,
            "nullable": not notnull and not pk,
            "primary_key": bool(pk),
            "default": default,
        }
        for _cid, name, col_type, notnull, default, pk in conn.execute(
            f"PRAGMA table_info({quoted})"
        )
    ]
    foreign_keys = [
        {"column": row[3], "references_table": row[2], "references_column": row[4] or "id"}
        for row in conn.execute(f"PRAGMA foreign_key_list({quoted})")
    ]
    (create_sql,) = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)
    ).fetchone()
    (row_count,) = conn.execute(f"SELECT count(*) FROM {quoted}").fetchone()
    return {
        "table": table,
        "row_count": int(row_count),
        "columns": columns,
        "foreign_keys": foreign_keys,
        "checks": check_constraints(create_sql or ""),
    }
