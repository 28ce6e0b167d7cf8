"""Strategy ``sql``: verifiable questions whose answers come from the server's own SQL.

For servers with ``list_tables`` / ``describe_table`` / ``run_query``. Entities (department
names, locations, roles, years, statuses, salary thresholds) are sampled from the live data
through ``run_query``; every question's ground truth is the result of its template's SQL,
also run through ``run_query``, and kept in ``ground_truth.sql`` for audit. Ambiguous
candidates (ties in rankings, empty answers, truncated results) are skipped. The same
database and seed give the same scenarios.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from typing import Any

from mcprl_common.wire import GroundTruth, Scenario
from mcprl_scenario_gen.errors import McpToolError, UnsupportedServerError
from mcprl_scenario_gen.mcp_client import SQL_TOOLS
from mcprl_scenario_gen.strategies.base import GenerationContext, GenerationParams, Strategy
from mcprl_scenario_gen.strategies.registry import register
from mcprl_scenario_gen.strategies.sql_common import (
    SQL_FORMAT,
    Binding,
    SqlTemplate,
    column_names,
    rows_of,
)
from mcprl_scenario_gen.strategies.sql_generic import generic_templates
from mcprl_scenario_gen.strategies.sql_templates import COMPANY_TEMPLATES

log = logging.getLogger(__name__)
QUERY_CONCURRENCY = 8
PER_TEMPLATE_CAP = 200

# Pools of entity values, read from the data. Each query returns one column, sorted.
POOL_SQL = {
    "department": "SELECT DISTINCT name FROM departments WHERE name IS NOT NULL ORDER BY name",
    "location": "SELECT DISTINCT location FROM departments WHERE location IS NOT NULL "
    "ORDER BY location",
    "role": "SELECT DISTINCT role FROM employees WHERE role IS NOT NULL ORDER BY role",
    "status": "SELECT DISTINCT status FROM projects WHERE status IS NOT NULL ORDER BY status",
    "year": "SELECT DISTINCT substr(hire_date, 1, 4) AS year FROM employees "
    "WHERE hire_date IS NOT NULL ORDER BY year",
    "salary": "SELECT salary FROM employees WHERE salary IS NOT NULL ORDER BY salary",
    "employee_count": "SELECT COUNT(*) AS n FROM employees",
}


def _quantile_thresholds(salaries: list[float]) -> list[int]:
    if len(salaries) < 4:
        return []
    values = sorted(salaries)
    out: set[int] = set()
    for q in (0.25, 0.5, 0.75):
        raw = values[int(q * (len(values) - 1))]
        step = 5000 if raw >= 20000 else (500 if raw >= 2000 else 10)
        out.add(int(round(raw / step) * step))
    return sorted(out)


@register
class SqlStrategy(Strategy):
    """Templates x entities from the data, answers from ``run_query``."""

    name = "sql"
    required_tools = SQL_TOOLS

    def pool_target(self, params: GenerationParams) -> int:
        factor = 3.0 if (params.holdout_entities or params.holdout_templates) else 1.5
        return max(int(params.n * factor), params.n + 20)

    async def query(self, ctx: GenerationContext, sql: str) -> tuple[list[list[Any]], bool]:
        return rows_of(await ctx.conn.call_json("run_query", {"sql": sql}))

    async def read_schema(self, ctx: GenerationContext) -> dict[str, dict[str, Any]]:
        tables = await ctx.conn.call_json("list_tables")
        if isinstance(tables, dict):
            tables = tables.get("tables", [])
        schema: dict[str, dict[str, Any]] = {}
        for table in sorted(str(t) for t in tables or []):
            try:
                described = await ctx.conn.call_json("describe_table", {"table_name": table})
            except McpToolError as exc:
                log.info("describe_table failed", extra={"table": table, "reason": exc.message})
                continue
            if isinstance(described, dict) and "error" in described and "columns" not in described:
                continue
            raw = described if isinstance(described, dict) else {"columns": described or []}
            schema[table] = {"columns": column_names(described), "raw": raw}
        ctx.known_tables = list(schema)
        return schema

    async def pools(self, ctx: GenerationContext, needed: set[str]) -> dict[str, list[Binding]]:
        raw: dict[str, list[Any]] = {}
        for name in sorted(needed & set(POOL_SQL)):
            rows, _ = await self.query(ctx, POOL_SQL[name])
            raw[name] = [r[0] for r in rows if r and r[0] not in (None, "")]
        if "year" in needed or "year_range" in needed:
            raw["year"] = [str(y) for y in raw.get("year", []) if str(y).isdigit()
                           and len(str(y)) == 4]
        out: dict[str, list[Binding]] = {}
        for name in ("department", "location", "role"):
            out[name] = [Binding({name: str(v)}, {name: str(v)}, (f"{name}={v}",), str(v))
                         for v in raw.get(name, [])]
        out["status"] = [Binding({"status": str(v).replace("_", " ")}, {"status": str(v)},
                                 (f"status={v}",), str(v)) for v in raw.get("status", [])]
        out["year"] = [Binding({"year": y}, {"year": y}, (f"year={y}",), y)
                       for y in raw.get("year", [])]
        years = raw.get("year", [])
        out["year_range"] = [
            Binding({"year_from": a, "year_to": b}, {"year_from": a, "year_to": b},
                    tuple(f"year={y}" for y in years[i:j + 1]), f"{a}-{b}")
            for i, a in enumerate(years) for j, b in enumerate(years) if 0 < j - i <= 2
        ]
        salaries = [float(v) for v in raw.get("salary", []) if isinstance(v, int | float)]
        out["threshold"] = [Binding({"threshold": f"{t:,}"}, {"threshold": t}, (), str(t))
                            for t in _quantile_thresholds(salaries)]
        out["k"] = [Binding({"k": str(k)}, {"k": k, "k1": k + 1}, (), str(k)) for k in (2, 3, 5)]
        return out

    async def templates_for(self, ctx: GenerationContext,
                            schema: dict[str, dict[str, Any]]) -> list[SqlTemplate]:
        def fits(t: SqlTemplate) -> bool:
            return all(table in schema and set(cols) <= set(schema[table]["columns"])
                       for table, cols in t.requires.items())

        company = [t for t in COMPANY_TEMPLATES if fits(t)]
        # The company family when the schema has it (it reads best); else schema-driven ones.
        if len(company) >= 5:
            return company
        return company + await generic_templates(schema, lambda sql: self.query(ctx, sql))

    def candidates(self, templates: list[SqlTemplate], pools: dict[str, list[Binding]],
                   rng: random.Random) -> list[tuple[SqlTemplate, Binding, int]]:
        """Every (template, binding, phrasing) to try, round-robin over templates."""

        per_template: list[list[tuple[SqlTemplate, Binding, int]]] = []
        order = list(templates)
        rng.shuffle(order)
        for t in order:
            if t.bindings is not None:
                combos = list(t.bindings)
            elif t.params:
                choices = [pools.get(p, []) for p in t.params]
                combos = [_merge(c) for c in itertools.product(*choices)]
            else:
                combos = [Binding({}, {}, (), "")]
            rng.shuffle(combos)
            items = [(t, b, rng.randrange(len(t.texts))) for b in combos[:PER_TEMPLATE_CAP]]
            if items:
                per_template.append(items)
        out = []
        for group in itertools.zip_longest(*per_template):
            out.extend(item for item in group if item is not None)
        return out

    async def build(self, ctx: GenerationContext, t: SqlTemplate, b: Binding,
                    phrasing: int) -> Scenario | str:
        """The scenario, or why this candidate was skipped."""

        sql = SQL_FORMAT.format(t.sql, **b.sql)
        try:
            rows, truncated = await self.query(ctx, sql)
        except McpToolError as exc:
            log.info("template query failed", extra={"template": t.name, "reason": exc.message})
            return "query failed"
        if truncated:
            return "result truncated"
        value = answer_value(t, rows, b.sql.get("k"))
        if isinstance(value, str) and value.startswith("skip:"):
            return value[5:]
        task = t.texts[phrasing].format(**b.text)
        return Scenario(
            id=Scenario.content_id(task), task=task, difficulty=t.difficulty, strategy="sql",
            ground_truth=GroundTruth(kind=t.kind, value=value, sql=sql), template=t.name,
            entities=sorted(set(b.entities)),
            metadata={"key": f"{t.name}|{b.key}", "params": dict(b.text)},
        )

    async def generate(self, ctx: GenerationContext) -> None:
        schema = await self.read_schema(ctx)
        templates = await self.templates_for(ctx, schema)
        if not templates:
            raise UnsupportedServerError(
                "no sql template fits this server's schema (tables: "
                f"{', '.join(schema) or 'none'})", param="strategy")
        needed = {p for t in templates for p in t.params}
        if "threshold" in needed:
            needed.add("salary")
        pools = await self.pools(ctx, needed)
        rng = random.Random(f"sql:{ctx.params.seed}")
        todo = self.candidates(templates, pools, rng)
        ctx.progress.phase = "generating"
        # Fill each difficulty's share of the pool; levels with no weight cost no queries.
        budget = ctx.settings.sql_max_candidates
        position = 0
        while budget > 0 and position < len(todo):
            missing = ctx.missing_by_difficulty()
            if not any(missing.values()):
                break
            chunk = []
            while position < len(todo) and len(chunk) < min(QUERY_CONCURRENCY, budget):
                item = todo[position]
                position += 1
                if missing[item[0].difficulty] > 0:
                    chunk.append(item)
            if not chunk:
                break
            budget -= len(chunk)
            results = await asyncio.gather(*(self.build(ctx, *item) for item in chunk))
            built = []
            for result in results:
                if isinstance(result, Scenario):
                    built.append(result)
                else:
                    ctx.progress.candidates += 1
                    ctx.reject(result)
            await ctx.offer(built)

def _merge(bindings: tuple[Binding, ...]) -> Binding:
    text: dict[str, str] = {}
    sql: dict[str, Any] = {}
    entities: list[str] = []
    keys = []
    for b in bindings:
        text.update(b.text)
        sql.update(b.sql)
        entities.extend(b.entities)
        keys.append(b.key)
    return Binding(text, sql, tuple(entities), "|".join(keys))


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    try:
        return float(str(value))
    except ValueError:
        return None


def answer_value(t: SqlTemplate, rows: list[list[Any]], k: int | None) -> Any:
    """The ground truth from the rows, or ``"skip:<reason>"`` when it would be ambiguous."""

    if t.kind == "number":
        if len(rows) != 1 or not rows[0]:
            return "skip:no single value"
        number = _number(rows[0][0])
        if number is None:
            return "skip:empty answer"
        return round(float(number), t.round_to) if t.round_to is not None else number
    names = [str(r[0]) for r in rows if r and r[0] is not None]
    if not names:
        return "skip:empty answer"
    if t.kind == "set":
        return sorted(set(names))
    if t.ties:
        need = k if t.kind == "list" and k else 1
        if len(rows) < need or any(len(r) < 2 for r in rows):
            return "skip:too few rows"
        metrics = [r[1] for r in rows[: need + 1]]
        if len(set(metrics)) < len(metrics):
            return "skip:tie"
        return names[:need] if t.kind == "list" else names[0]
    if len(set(names)) != 1:
        return "skip:ambiguous answer"
    return names[0]
