"""Read-only SQL execution enforced by SQLite itself.

Three independent layers, so no single bug turns a query into a write:

1. the file is opened with ``mode=ro`` (SQLite refuses to write pages) and ``query_only``;
2. an authorizer allows only reading actions (SELECT, READ of columns, non-blacklisted
   FUNCTIONs, recursive CTEs and a few introspection PRAGMAs); everything else, including
   ATTACH, VACUUM INTO, temp objects, transactions and ``load_extension``, is denied while
   the statement is being prepared, before anything runs;
3. Python's sqlite3 refuses to run more than one statement per ``execute``.

A progress handler stops any statement at its deadline (a runaway recursive CTE included),
``fetchmany`` enforces the row and size caps, and SQLite's own length limits bound memory.
Each worker thread has its own connection (no shared cursor); callers run :meth:`query`
via ``anyio.to_thread`` so the event loop never waits on SQLite.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcprl_mcp_server.db import schema

# Introspection pragmas whose argument is a name, never a value to store.
READ_PRAGMAS = frozenset(
    {"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo",
     "foreign_key_list", "table_list"}
)  # fmt: skip
DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"})
READ_ONLY_MESSAGE = "read-only: only SELECT/WITH queries are allowed"
_ACTION_NAMES = {
    code: name.removeprefix("SQLITE_").replace("_", " ")
    for name in (
        "SQLITE_CREATE_INDEX", "SQLITE_CREATE_TABLE", "SQLITE_CREATE_TEMP_INDEX",
        "SQLITE_CREATE_TEMP_TABLE", "SQLITE_CREATE_TEMP_TRIGGER", "SQLITE_CREATE_TEMP_VIEW",
        "SQLITE_CREATE_TRIGGER", "SQLITE_CREATE_VIEW", "SQLITE_DELETE", "SQLITE_DROP_INDEX",
        "SQLITE_DROP_TABLE", "SQLITE_DROP_TEMP_INDEX", "SQLITE_DROP_TEMP_TABLE",
        "SQLITE_DROP_TEMP_TRIGGER", "SQLITE_DROP_TEMP_VIEW", "SQLITE_DROP_TRIGGER",
        "SQLITE_DROP_VIEW", "SQLITE_INSERT", "SQLITE_PRAGMA", "SQLITE_TRANSACTION",
        "SQLITE_UPDATE", "SQLITE_ATTACH", "SQLITE_DETACH", "SQLITE_ALTER_TABLE",
        "SQLITE_REINDEX", "SQLITE_ANALYZE", "SQLITE_CREATE_VTABLE", "SQLITE_DROP_VTABLE",
        "SQLITE_SAVEPOINT",
    )
    if (code := getattr(sqlite3, name, None)) is not None
}  # fmt: skip
_COMMENTS = re.compile(r"--[^\n]*|/\*.*?(\*/|$)", re.S)
_NEAR = re.compile(r'near "(?P<token>.*)": syntax error', re.S)


class QueryError(Exception):
    """A query the agent should fix; ``kind`` feeds the outcome label of the metrics."""

    def __init__(self, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind  # error | refused | timeout


@dataclass
class QueryResult:
    columns: list[str]
    results: list[dict[str, Any]]
    row_count: int
    truncated: bool
    elapsed_ms: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "columns": self.columns,
            "results": self.results,
            "row_count": self.row_count,
            "truncated": self.truncated,
            "elapsed_ms": self.elapsed_ms,
        }


@dataclass
class Limits:
    timeout_s: float = 5.0
    max_rows: int = 1000
    max_result_bytes: int = 256 * 1024
    max_sql_chars: int = 20_000
    # Bound memory: no string/blob above this many bytes (zeroblob(1e9) fails fast).
    max_value_bytes: int = 8 * 1024 * 1024


@dataclass
class _CallState:
    """Per-statement state the SQLite callbacks read and write (one per thread)."""

    deadline: float = math.inf
    timed_out: bool = False
    denied: list[str] = field(default_factory=list)


class ReadOnlyDatabase:
    """A SQLite file opened read-only, one connection per worker thread."""

    def __init__(self, path: Path, limits: Limits | None = None) -> None:
        self.path = Path(path).resolve()
        self.limits = limits or Limits()
        self._local = threading.local()
        # thread -> its connection; entries of finished threads are closed on the next open
        self._all: dict[threading.Thread, sqlite3.Connection] = {}
        self._lock = threading.Lock()
        self._closed = False

    # --- connections ---------------------------------------------------------------------

    def _connection(self) -> tuple[sqlite3.Connection, _CallState]:
        if self._closed:
            raise QueryError("the database is shutting down; retry shortly")
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                f"{self.path.as_uri()}?mode=ro", uri=True, check_same_thread=False,
                isolation_level=None,  # autocommit: the module never opens a transaction
            )  # fmt: skip
            conn.execute("PRAGMA query_only = ON")
            conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, self.limits.max_value_bytes)
            conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, max(self.limits.max_sql_chars * 4, 1000))
            conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
            state = _CallState()
            conn.set_authorizer(_authorizer(state))
            conn.set_progress_handler(_progress(state), 1000)
            self._local.conn, self._local.state = conn, state
            with self._lock:
                dead = [t for t in self._all if not t.is_alive()]
                stale = [self._all.pop(t) for t in dead]
                self._all[threading.current_thread()] = conn
            for old in stale:
                with contextlib.suppress(sqlite3.Error):
                    old.close()
        return conn, self._local.state

    def close(self) -> None:
        """Close every thread's connection (at shutdown, when no query runs any more)."""

        self._closed = True
        with self._lock:
            conns, self._all = list(self._all.values()), {}
        for conn in conns:
            with contextlib.suppress(sqlite3.Error):
                conn.close()

    # --- operations ----------------------------------------------------------------------

    def tables(self) -> list[str]:
        conn, state = self._connection()
        self._arm(state)
        try:
            return schema.user_tables(conn)
        except sqlite3.Error as exc:
            raise QueryError(f"cannot read the table list: {exc}") from exc
        finally:
            self._disarm(state)

    def describe(self, table: str) -> dict[str, Any]:
        tables = self.tables()
        match = next((t for t in tables if t == table), None) or next(
            (t for t in tables if t.lower() == table.strip().lower()), None
        )
        if match is None:
            raise QueryError(
                f"Table {table!r} not found. Existing tables: {', '.join(tables)}. "
                "Call list_tables to see them, then describe_table with one of those names."
            )
        conn, state = self._connection()
        self._arm(state)
        try:
            return schema.describe(conn, match)
        except sqlite3.Error as exc:
            raise self._translate(exc, "", state) from exc
        finally:
            self._disarm(state)

    def query(self, sql: str) -> QueryResult:
        """Run one read-only statement with the time limit and caps; raise QueryError."""

        if not isinstance(sql, str) or not _COMMENTS.sub("", sql).strip(" \t\r\n;"):
            raise QueryError("empty query: pass one SELECT (or WITH ... SELECT) statement")
        if len(sql) > self.limits.max_sql_chars:
            raise QueryError(
                f"query too long ({len(sql)} characters, limit {self.limits.max_sql_chars})"
            )
        if "\x00" in sql:
            raise QueryError("the query contains a NUL character; remove it")
        conn, state = self._connection()
        start = time.perf_counter()
        self._arm(state)
        try:
            cur = conn.cursor()
            try:
                cur.execute(sql)
                columns = [d[0] for d in cur.description or ()]
                results, truncated = self._fetch(cur, columns)
                # A single slow C function (no VM steps, so no progress callback) can still
                # overrun; its answer is not returned late either.
                if time.monotonic() > state.deadline:
                    state.timed_out = True
                    raise sqlite3.OperationalError("interrupted")
            finally:
                cur.close()
        except sqlite3.Error as exc:
            raise self._translate(exc, sql, state) from exc
        except (OverflowError, ValueError, MemoryError) as exc:
            raise QueryError(f"query failed: {exc}") from exc
        finally:
            self._disarm(state)
        if not columns:  # e.g. a bare read PRAGMA with no result set
            columns = []
        return QueryResult(
            columns=columns,
            results=results,
            row_count=len(results),
            truncated=truncated,
            elapsed_ms=round((time.perf_counter() - start) * 1000, 3),
        )

    def _fetch(self, cur: sqlite3.Cursor, columns: list[str]) -> tuple[list[dict], bool]:
        keys = _unique_keys(columns)
        results: list[dict[str, Any]] = []
        size = 2
        cap, budget = self.limits.max_rows, self.limits.max_result_bytes
        while True:
            batch = cur.fetchmany(min(256, cap + 1 - len(results)))
            if not batch:
                return results, False
            for row in batch:
                if len(results) >= cap:
                    return results, True
                item = {k: _jsonable(v) for k, v in zip(keys, row, strict=True)}
                size += len(json.dumps(item, ensure_ascii=False, default=str)) + 1
                if size > budget:
                    return results, True
                results.append(item)

    def _arm(self, state: _CallState) -> None:
        state.deadline = time.monotonic() + self.limits.timeout_s
        state.timed_out = False
        state.denied.clear()

    @staticmethod
    def _disarm(state: _CallState) -> None:
        state.deadline = math.inf

    def _translate(self, exc: sqlite3.Error, sql: str, state: _CallState) -> QueryError:
        text = str(exc)
        if state.timed_out or text == "interrupted":
            return QueryError(
                f"query stopped after {self.limits.timeout_s:g} s (the time limit): make it "
                "cheaper (add WHERE/LIMIT, bound recursive CTEs) and retry",
                kind="timeout",
            )
        if state.denied:
            what = state.denied[0]
            if "pragma_" in sql.lower() and what.startswith("UPDATE sqlite_"):
                return QueryError(
                    "table-valued PRAGMA functions (pragma_table_info(...) etc.) are not "
                    "available here: call describe_table, or run PRAGMA table_info(<table>)",
                    kind="refused",
                )
            if what.startswith("function "):
                return QueryError(f"{what} is not allowed; {READ_ONLY_MESSAGE}", kind="refused")
            return QueryError(f"{READ_ONLY_MESSAGE} (refused: {what})", kind="refused")
        if "readonly database" in text or "query_only" in text or "not authorized" in text:
            return QueryError(READ_ONLY_MESSAGE, kind="refused")
        if isinstance(exc, sqlite3.ProgrammingError) and "one statement" in text:
            return QueryError(
                "only one statement per call: remove the ';' separated extra statements "
                f"({READ_ONLY_MESSAGE})",
                kind="refused",
            )
        if "bindings" in text:
            return QueryError(
                f"SQL error: {text.rstrip('.')}. run_query takes no parameters: write the "
                "values into the SQL as literals (strings in single quotes)"
            )
        message = f"SQL error: {text}"
        if "no such table" in text:
            message += f". Existing tables: {', '.join(self.tables())} (see list_tables)"
        elif "no such column" in text:
            message += ". Call describe_table to see the columns of each table"
        near = _NEAR.search(text)
        if near and sql:
            message += _position(sql, near.group("token"))
        elif "incomplete input" in text and sql:
            message += f" (the statement ends early at character {len(sql.rstrip())})"
        return QueryError(message)


def _authorizer(state: _CallState):  # type: ignore[no-untyped-def]
    """Allow reading actions only; remember the first refusal to explain it."""

    allowed = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE}

    def authorize(action: int, arg1: str | None, arg2: str | None, db: str | None,
                  _src: str | None) -> int:  # fmt: skip
        if action in allowed:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION:
            if (arg2 or "").lower() in DENIED_FUNCTIONS:
                state.denied.append(f"function {arg2}()")
                return sqlite3.SQLITE_DENY
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in READ_PRAGMAS:
            return sqlite3.SQLITE_OK
        name = _ACTION_NAMES.get(action, f"action {action}")
        target = arg1 if action != sqlite3.SQLITE_PRAGMA else f"{arg1}"
        state.denied.append(f"{name} {target}" if target else name)
        return sqlite3.SQLITE_DENY

    return authorize


def _progress(state: _CallState):  # type: ignore[no-untyped-def]
    def tick() -> int:
        if time.monotonic() > state.deadline:
            state.timed_out = True
            return 1  # non-zero interrupts the statement
        return 0

    return tick


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return "x'" + value.hex() + "'"  # SQLite's own blob literal syntax
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no Infinity/NaN
    return value


def _unique_keys(columns: list[str]) -> list[str]:
    """Row objects need unique keys; ``SELECT a.id, b.id`` gives ``id`` and ``id_2``."""

    seen: dict[str, int] = {}
    keys: list[str] = []
    for col in columns:
        if col in seen:
            seen[col] += 1
            key = f"{col}_{seen[col]}"
            while key in seen:
                seen[col] += 1
                key = f"{col}_{seen[col]}"
            seen[key] = 1
        else:
            seen[col] = 1
            key = col
        keys.append(key)
    return keys


def _position(sql: str, token: str) -> str:
    """Say where the near-token is (character, line, column) with a caret under it."""

    at = sql.find(token) if token else len(sql.rstrip())
    if at < 0:
        return ""
    line_no = sql.count("\n", 0, at) + 1
    line_start = sql.rfind("\n", 0, at) + 1
    line_end = sql.find("\n", at)
    line = sql[line_start : line_end if line_end >= 0 else len(sql)]
    col = at - line_start + 1
    where = "end of input" if not token else f"character {at + 1} (line {line_no}, column {col})"
    snippet = line if len(line) <= 160 else line[max(0, col - 80) : col + 80]
    caret_col = col - 1 if len(line) <= 160 else min(col - 1, 79)
    return f" at {where}:\n  {snippet}\n  {' ' * caret_col}^"
