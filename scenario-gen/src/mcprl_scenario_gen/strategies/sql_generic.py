"""Schema-driven templates of the ``sql`` strategy, for SQL servers of any domain.

Built from what ``describe_table`` reveals: per table a label column (``name``, ``title``,
...), numeric columns, low-cardinality text columns (categories, with their values read from
the data) and foreign keys (declared, or inferred from ``<thing>_id`` columns). The
questions name tables and columns, so they read less naturally than the company family,
but they are just as verifiable.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from mcprl_scenario_gen.strategies.sql_common import Binding, SqlTemplate, sql_literal

QueryFn = Callable[[str], Awaitable[tuple[list[list[Any]], bool]]]
NUMBER = " Answer with the number only."
_NUMERIC = ("INT", "REAL", "NUM", "FLOA", "DOUB", "DEC")
MAX_VALUES = 6


@dataclass
class TableFacts:
    name: str
    label: str | None = None
    numeric: list[str] = field(default_factory=list)
    categories: dict[str, list[str]] = field(default_factory=dict)
    labels: list[str] = field(default_factory=list)
    fks: list[tuple[str, str, str]] = field(default_factory=list)  # column, table, column


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _columns(raw: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in raw.get("columns", []) if isinstance(c, dict) and c.get("name")]


def _fks(table: str, raw: dict[str, Any], tables: set[str]) -> list[tuple[str, str, str]]:
    declared = [(str(f["column"]), str(f["references_table"]), str(f.get("references_column")
                                                                     or "id"))
                for f in raw.get("foreign_keys", []) or []
                if isinstance(f, dict) and f.get("column") and f.get("references_table")]
    if declared:
        return declared
    out = []
    for col in _columns(raw):
        name = str(col["name"])
        if name.endswith("_id") and name != "id":
            stem = name[:-3]
            for cand in (stem + "s", stem + "es", stem):
                if cand in tables and cand != table:
                    out.append((name, cand, "id"))
                    break
    return out


async def table_facts(schema: dict[str, dict[str, Any]], query: QueryFn) -> list[TableFacts]:
    tables = set(schema)
    facts = []
    for table in sorted(schema):
        raw = schema[table].get("raw") or {}
        cols = _columns(raw)
        fk_cols = {c for c, _, _ in _fks(table, raw, tables)}
        f = TableFacts(table, fks=_fks(table, raw, tables))
        texts = [str(c["name"]) for c in cols if "CHAR" in str(c.get("type", "")).upper()
                 or "TEXT" in str(c.get("type", "")).upper()]
        for pref in ("name", "title", "label"):
            f.label = f.label or next((t for t in texts if t == pref or t.endswith("_" + pref)),
                                      None)
        f.label = f.label or (texts[0] if texts else None)
        f.numeric = [str(c["name"]) for c in cols
                     if any(k in str(c.get("type", "")).upper() for k in _NUMERIC)
                     and not c.get("primary_key") and str(c["name"]) not in fk_cols
                     and str(c["name"]) != "id" and not str(c["name"]).endswith("_id")]
        for col in texts:
            if col == f.label:
                continue
            rows, _ = await query(f"SELECT DISTINCT {_ident(col)} FROM {_ident(table)} "
                                  f"WHERE {_ident(col)} IS NOT NULL ORDER BY 1 LIMIT 13")
            values = [str(r[0]) for r in rows if r and r[0] not in (None, "")]
            if 2 <= len(values) <= 12:
                f.categories[col] = values[:MAX_VALUES]
        if f.label:
            rows, _ = await query(f"SELECT DISTINCT {_ident(f.label)} FROM {_ident(table)} "
                                  f"WHERE {_ident(f.label)} IS NOT NULL ORDER BY 1 LIMIT "
                                  f"{MAX_VALUES}")
            f.labels = [str(r[0]) for r in rows if r and r[0] not in (None, "")]
        facts.append(f)
    return facts


def _b(text: dict[str, str], entities: tuple[str, ...] = (), **sql: Any) -> Binding:
    return Binding(text, sql, entities, "|".join(f"{k}={v}" for k, v in sorted(text.items())))


def _tpl(name: str, difficulty: int, kind: str, text: str, sql: str,
         bindings: list[Binding], **kw: Any) -> SqlTemplate:
    return SqlTemplate(name, difficulty, kind, (text,), sql, bindings=tuple(bindings),  # type: ignore[arg-type]
                       **kw)


async def generic_templates(schema: dict[str, dict[str, Any]], query: QueryFn
                            ) -> list[SqlTemplate]:
    facts = {f.name: f for f in await table_facts(schema, query)}
    out: list[SqlTemplate] = []
    q = _ident
    out.append(_tpl("g_count_rows", 1, "number",
                    "How many records does the {table} table contain?" + NUMBER,
                    "SELECT COUNT(*) FROM {tq}",
                    [_b({"table": t}, tq=q(t)) for t in facts]))
    cat = [(f, c, v) for f in facts.values() for c, vs in f.categories.items() for v in vs]
    out.append(_tpl("g_count_by_value", 1, "number",
                    "How many records in the {table} table have {column} equal to "
                    "'{value}'?" + NUMBER,
                    "SELECT COUNT(*) FROM {tq} WHERE {cq} = {vq}",
                    [_b({"table": f.name, "column": c, "value": v}, (f"{f.name}.{c}={v}",),
                        tq=q(f.name), cq=q(c), vq=sql_literal(v)) for f, c, v in cat]))
    num = [(f, n) for f in facts.values() for n in f.numeric]
    out.append(_tpl("g_max", 2, "number", "What is the highest {column} in the {table} table?"
                    + NUMBER, "SELECT MAX({cq}) FROM {tq}",
                    [_b({"table": f.name, "column": n}, tq=q(f.name), cq=q(n)) for f, n in num]))
    out.append(_tpl("g_avg", 2, "number", "What is the average {column} across the {table} "
                    "table? Round to two decimals and answer with the number only.",
                    "SELECT AVG({cq}) FROM {tq}",
                    [_b({"table": f.name, "column": n}, tq=q(f.name), cq=q(n)) for f, n in num],
                    round_to=2))
    out.append(_tpl("g_sum_by_value", 3, "number", "What is the total {column} of the "
                    "records in the {table} table whose {category} is '{value}'?" + NUMBER,
                    "SELECT SUM({nq}) FROM {tq} WHERE {cq} = {vq}",
                    [_b({"table": f.name, "column": n, "category": c, "value": v},
                        (f"{f.name}.{c}={v}",), tq=q(f.name), nq=q(n), cq=q(c),
                        vq=sql_literal(v))
                     for f, n in num for c, vs in f.categories.items() for v in vs]))
    ranked = [(f, n, k) for f, n in num if f.label for k in (2, 3)]
    out.append(_tpl("g_top_k", 3, "list", "Which {k} records of the {table} table have the "
                    "highest {column}? List their {label} values from highest to lowest, "
                    "separated by commas.",
                    "SELECT {lq}, {nq} FROM {tq} WHERE {nq} IS NOT NULL ORDER BY {nq} DESC "
                    "LIMIT {k1}",
                    [_b({"table": f.name, "column": n, "label": f.label or "", "k": str(k)},
                        tq=q(f.name), nq=q(n), lq=q(f.label or ""), k=k, k1=k + 1)
                     for f, n, k in ranked], ties=True))
    links = [(child, col, facts[parent], pcol) for child in facts.values()
             for col, parent, pcol in child.fks if parent in facts and facts[parent].label]
    fk_count, fk_sum, fk_top, fk_filtered, fk_top_sum = [], [], [], [], []
    for child, col, parent, pcol in links:
        base = {"child": child.name, "parent": parent.name, "label": parent.label or ""}
        sql = dict(cq=q(child.name), fq=q(col), pq=q(parent.name), pk=q(pcol),
                   lq=q(parent.label or ""))
        fk_top.append(_b(base, **sql))
        for n in child.numeric:
            fk_top_sum.append(_b({**base, "column": n}, **sql, nq=q(n)))
        for value in parent.labels:
            ent = (f"{parent.name}.{parent.label}={value}",)
            fk_count.append(_b({**base, "value": value}, ent, **sql, vq=sql_literal(value)))
            for n in child.numeric:
                fk_sum.append(_b({**base, "value": value, "column": n}, ent, **sql,
                                 vq=sql_literal(value), nq=q(n)))
            for category, values in child.categories.items():
                for cv in values:
                    fk_filtered.append(_b(
                        {**base, "value": value, "category": category, "cv": cv},
                        (*ent, f"{child.name}.{category}={cv}"), **sql, vq=sql_literal(value),
                        kq=q(category), cvq=sql_literal(cv)))
    join = "FROM {cq} c JOIN {pq} p ON c.{fq} = p.{pk}"
    out.append(_tpl("g_fk_count", 3, "number", "How many records in the {child} table belong "
                    "to the {parent} record whose {label} is '{value}'?" + NUMBER,
                    "SELECT COUNT(*) " + join + " WHERE p.{lq} = {vq}", fk_count))
    out.append(_tpl("g_fk_sum", 4, "number", "What is the total {column} of the {child} "
                    "records linked to the {parent} record whose {label} is '{value}'?" + NUMBER,
                    "SELECT SUM(c.{nq}) " + join + " WHERE p.{lq} = {vq}", fk_sum))
    out.append(_tpl("g_fk_top_parent", 4, "text", "Which record of the {parent} table has the "
                    "most {child} records linked to it? Answer with its {label} only.",
                    "SELECT p.{lq}, COUNT(*) AS n " + join + " GROUP BY p.{pk}, p.{lq} "
                    "ORDER BY n DESC LIMIT 2", fk_top, ties=True))
    out.append(_tpl("g_fk_count_filtered", 5, "number", "How many records in the {child} "
                    "table with {category} '{cv}' belong to the {parent} record whose {label} "
                    "is '{value}'?" + NUMBER,
                    "SELECT COUNT(*) " + join + " WHERE p.{lq} = {vq} AND c.{kq} = {cvq}",
                    fk_filtered))
    out.append(_tpl("g_fk_top_parent_by_sum", 5, "text", "Which record of the {parent} table "
                    "has the highest total {column} summed over its {child} records? Answer "
                    "with its {label} only.",
                    "SELECT p.{lq}, SUM(c.{nq}) AS total " + join + " GROUP BY p.{pk}, p.{lq} "
                    "ORDER BY total DESC LIMIT 2", fk_top_sum, ties=True))
    return [t for t in out if t.bindings]
