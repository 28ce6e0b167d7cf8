"""Pieces shared by the ``sql`` strategy's template families: templates, bindings, SQL
literals and the shapes ``run_query`` / ``describe_table`` answers come in."""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any

from mcprl_common.wire import AnswerKind
from mcprl_scenario_gen.errors import McpToolError


def sql_literal(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


class _SqlFormatter(string.Formatter):
    """``{x!q}`` renders ``x`` as a quoted SQL literal."""

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion == "q":
            return sql_literal(value)
        return super().convert_field(value, conversion)


SQL_FORMAT = _SqlFormatter()


@dataclass(frozen=True)
class Binding:
    """One value of a template parameter: how it reads, what SQL sees, what entity it is."""

    text: dict[str, str]
    sql: dict[str, Any]
    entities: tuple[str, ...] = ()
    key: str = ""


def rows_of(result: Any) -> tuple[list[list[Any]], bool]:
    """Rows as lists (column order kept) and the truncated flag, from any run_query shape."""

    if isinstance(result, dict):
        if "error" in result and "results" not in result:
            raise McpToolError(f"run_query returned an error: {result['error']}")
        rows = result.get("results", result.get("rows", []))
        truncated = bool(result.get("truncated", False))
    else:
        rows, truncated = result, False
    out: list[list[Any]] = []
    for row in rows or []:
        if isinstance(row, dict):
            out.append(list(row.values()))
        elif isinstance(row, list | tuple):
            out.append(list(row))
        else:
            out.append([row])
    return out, truncated


@dataclass(frozen=True)
class SqlTemplate:
    name: str
    difficulty: int
    kind: AnswerKind
    texts: tuple[str, ...]
    sql: str
    params: tuple[str, ...] = ()
    requires: dict[str, tuple[str, ...]] = field(default_factory=dict)
    ties: bool = False
    """The SQL returns (name, metric) rows, k + 1 of them; skip candidates with ties."""

    round_to: int | None = None
    bindings: tuple[Binding, ...] | None = None
    """Values fixed by the template itself (schema-driven families); else pools by params."""


def column_names(described: Any) -> list[str]:
    cols = described.get("columns", []) if isinstance(described, dict) else described
    names = []
    for col in cols or []:
        if isinstance(col, dict) and col.get("name"):
            names.append(str(col["name"]))
    return names


