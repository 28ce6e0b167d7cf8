"""The three MCP tools of the company-db server and the error type they raise.

Results follow one contract that other services code against:

* ``list_tables()`` -> JSON array of table names;
* ``describe_table(table_name)`` -> ``{table, row_count, columns[{name, type, nullable,
  primary_key, default}], foreign_keys[{column, references_table, references_column}],
  checks[str]}``;
* ``run_query(sql)`` -> ``{columns, results[{column: value}], row_count, truncated,
  elapsed_ms}``.

Every failure raises :class:`AgentToolError` (a FastMCP ``ToolError``: the client sees
``isError``) with a message that tells the agent how to recover.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Annotated, Any

import anyio
from fastmcp import FastMCP
from fastmcp.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field
from typing_extensions import TypedDict

from mcprl_mcp_server.db.readonly import QueryError, ReadOnlyDatabase

READ_ONLY = ToolAnnotations(
    read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
)

LIST_TABLES_DOC = (
    "List the tables of the company database (a SQLite database about a company's "
    "departments, employees and projects). Start here, then call describe_table on the "
    "tables you need, then run_query. Returns a JSON array of table names."
)
DESCRIBE_TABLE_DOC = (
    "Describe one table of the company database: its columns (name, SQLite type, nullable, "
    "primary key, default), foreign keys (which column references which table.column - "
    "use them to JOIN), CHECK constraints (e.g. the allowed values of a status column) and "
    "its row count. Call list_tables first if you do not know the table names."
)
RUN_QUERY_DOC = (
    "Run one read-only SQL query (SQLite dialect) on the company database and return "
    "{{columns, results: [{{column: value}}], row_count, truncated, elapsed_ms}}. Only SELECT "
    "and WITH ... SELECT statements are allowed, one per call; writes and schema changes are "
    "refused. Use JOINs on the foreign keys shown by describe_table, GROUP BY for "
    "aggregates, and SQLite date functions on the ISO 'YYYY-MM-DD' date columns (e.g. "
    "strftime('%Y', hire_date), date('now'), julianday). Results are capped at {max_rows} "
    "rows and {max_kib} KiB ('truncated': true when cut; add LIMIT or aggregate) and each "
    "query is stopped after {timeout:g} s. On an error, read the message, fix the SQL and "
    "call again."
)


class AgentToolError(ToolError):
    """A tool failure the agent can act on; ``kind`` labels the metrics outcome."""

    def __init__(self, message: str, kind: str = "error") -> None:
        super().__init__(message, log_level=logging.INFO)
        self.kind = kind


class ColumnInfo(TypedDict):
    name: str
    type: str
    nullable: bool
    primary_key: bool
    default: Any


class ForeignKeyInfo(TypedDict):
    column: str
    references_table: str
    references_column: str


class TableDescription(TypedDict):
    table: str
    row_count: int
    columns: list[ColumnInfo]
    foreign_keys: list[ForeignKeyInfo]
    checks: list[str]


class QueryResultDict(TypedDict):
    columns: list[str]
    results: list[dict[str, Any]]
    row_count: int
    truncated: bool
    elapsed_ms: float


class CompanyTools:
    """Tool implementations over one database; SQLite work runs in worker threads."""

    def __init__(self, db: ReadOnlyDatabase, max_concurrent: int = 8) -> None:
        self.db = db
        self.limiter = anyio.CapacityLimiter(max_concurrent)

    async def _run(self, fn: Any, *args: Any) -> Any:
        try:
            return await anyio.to_thread.run_sync(partial(fn, *args), limiter=self.limiter)
        except QueryError as exc:
            raise AgentToolError(exc.message, kind=exc.kind) from None

    async def list_tables(self) -> list[str]:
        return await self._run(self.db.tables)

    async def describe_table(self, table_name: str) -> TableDescription:
        return await self._run(self.db.describe, table_name)

    async def run_query(self, sql: str) -> QueryResultDict:
        result = await self._run(self.db.query, sql)
        return result.as_dict()  # type: ignore[return-value]

    def register(self, mcp: FastMCP) -> None:
        """Add the three tools to ``mcp`` with agent-oriented descriptions."""

        limits = self.db.limits
        tools = self

        async def list_tables() -> list[str]:
            return await tools.list_tables()

        async def describe_table(
            table_name: Annotated[
                str, Field(description="A table name from list_tables, e.g. 'employees'.")
            ],
        ) -> TableDescription:
            return await tools.describe_table(table_name)

        async def run_query(
            sql: Annotated[
                str,
                Field(description="One SQLite SELECT or WITH ... SELECT statement."),
            ],
        ) -> QueryResultDict:
            return await tools.run_query(sql)

        mcp.tool(list_tables, description=LIST_TABLES_DOC, annotations=READ_ONLY)
        mcp.tool(describe_table, description=DESCRIBE_TABLE_DOC, annotations=READ_ONLY)
        mcp.tool(
            run_query,
            description=RUN_QUERY_DOC.format(
                max_rows=limits.max_rows,
                max_kib=limits.max_result_bytes // 1024,
                timeout=limits.timeout_s,
            ),
            annotations=READ_ONLY,
        )
