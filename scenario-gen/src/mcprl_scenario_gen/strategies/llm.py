"""Strategy ``llm``: an OpenAI-compatible model writes the tasks.

The prompt shows the tools and what the server's own discovery reveals, so the model writes
about data that exists: for SQL servers each table's schema and 3 sample rows (what the
tutorial does by hand), for other servers the tool list and the resources (with the text of
a few small ones). Tasks are asked for in batches, with the difficulties still missing from
the requested mix and the tasks already written (to avoid repeats). Entities seen in the
sample rows are tagged on each task, so entity holdout works here too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
from typing import Any

from mcprl_common.wire import Scenario
from mcprl_scenario_gen.errors import LlmOutputError, LlmUnavailableError, McpToolError
from mcprl_scenario_gen.llm_client import GeneratorLLM
from mcprl_scenario_gen.strategies.base import GenerationContext, GenerationParams, Strategy
from mcprl_scenario_gen.strategies.registry import register
from mcprl_scenario_gen.strategies.sql_common import column_names, rows_of

log = logging.getLogger(__name__)
MAX_TABLES = 30
MAX_RESOURCES_READ = 3
AVOID_LAST = 25

SYSTEM = (
    "You design tasks for training and evaluating an AI agent that can act only through the "
    "tools of one MCP server. Every task must be solvable with those tools alone, using only "
    "data the server really has."
)
DIFFICULTY_SCALE = (
    "Difficulty scale: 1 = one simple lookup with one tool call; 2 = a filter or a single "
    "aggregate; 3 = an aggregate over a join, a ranking or a date range; 4 = several steps or "
    "three tables combined; 5 = multi-step reasoning over several queries and conditions."
)


def _params_sig(schema: dict[str, Any]) -> str:
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    parts = []
    for name, spec in props.items():
        kind = spec.get("type", "any") if isinstance(spec, dict) else "any"
        parts.append(f"{name}: {kind}" + ("" if name in required else " (optional)"))
    return ", ".join(parts)


def _columns_line(described: Any) -> str:
    cols = described.get("columns", []) if isinstance(described, dict) else described
    fks = {f.get("column"): f"{f.get('references_table')}.{f.get('references_column')}"
           for f in (described.get("foreign_keys", []) if isinstance(described, dict) else [])
           if isinstance(f, dict)}
    parts = []
    for col in cols or []:
        if not isinstance(col, dict):
            continue
        text = f"{col.get('name')} {col.get('type', '')}".strip()
        if col.get("primary_key"):
            text += " primary key"
        if col.get("name") in fks:
            text += f" -> {fks[col.get('name')]}"
        parts.append(text)
    checks = described.get("checks") if isinstance(described, dict) else None
    line = ", ".join(parts)
    if checks:
        line += "; checks: " + "; ".join(str(c) for c in checks)
    return line


@register
class LlmStrategy(Strategy):
    """Tasks written by the generator model from the server's tools and data."""

    name = "llm"
    uses_llm = True

    def pool_target(self, params: GenerationParams) -> int:
        extra = 0.3 if (params.holdout_entities or params.holdout_templates) else 0.0
        return params.n + math.ceil(params.n * extra)

    async def describe_server(self, ctx: GenerationContext) -> tuple[str, dict[str, str]]:
        """The prompt's picture of the server, and entity values seen in the data."""

        lines = ["Tools:"]
        for tool in ctx.server.tools:
            desc = " ".join(tool.description.split())[:400]
            lines.append(f"- {tool.name}({_params_sig(tool.input_schema)}): {desc}")
        vocab: dict[str, str] = {}
        if ctx.server.is_sql:
            lines.append("\nDatabase (from list_tables, describe_table and run_query):")
            tables = await ctx.conn.call_json("list_tables")
            if isinstance(tables, dict):
                tables = tables.get("tables", [])
            known = []
            for table in [str(t) for t in tables or []][:MAX_TABLES]:
                try:
                    described = await ctx.conn.call_json("describe_table",
                                                         {"table_name": table})
                    quoted = '"' + table.replace('"', '""') + '"'
                    rows_raw = await ctx.conn.call_json(
                        "run_query", {"sql": f"SELECT * FROM {quoted} LIMIT 3"})
                except McpToolError as exc:
                    log.info("skipping table", extra={"table": table, "reason": exc.message})
                    continue
                known.append(table)
                count = described.get("row_count") if isinstance(described, dict) else None
                head = f"Table {table}" + (f" ({count} rows)" if count is not None else "")
                lines.append(f"{head}: {_columns_line(described)}")
                names = column_names(described)
                raw_rows = rows_raw.get("results", []) if isinstance(rows_raw, dict) else []
                for row in raw_rows[:3]:
                    lines.append("  sample row: " + json.dumps(row, ensure_ascii=False,
                                                                default=str))
                rows, _ = rows_of(rows_raw)
                for row in rows:
                    for col, value in zip(names, row, strict=False):
                        if (isinstance(value, str) and 3 <= len(value) <= 40
                                and not value.replace("-", "").isdigit() and col != "id"):
                            vocab.setdefault(value, f"{table}.{col}={value}")
            ctx.known_tables = known
        if ctx.server.resources:
            lines.append("\nResources:")
            for res in ctx.server.resources[:50]:
                lines.append(f"- {res.name} <{res.uri}>: {res.description[:200]}")
            for res in ctx.server.resources[:MAX_RESOURCES_READ]:
                text = await ctx.conn.read_text_resource(res.uri, 1000)
                if text:
                    lines.append(f"Content of {res.uri}:\n{text}")
        context = "\n".join(lines)
        limit = ctx.settings.llm_context_max_chars
        if len(context) > limit:
            context = context[:limit] + "\n[... truncated]"
        return context, vocab

    def prompt(self, context: str, counts: dict[int, int], avoid: list[str]) -> list[dict]:
        total = sum(counts.values())
        wanted = ", ".join(f"{c} of difficulty {d}" for d, c in counts.items() if c)
        lines = [
            "The MCP server:", context, "",
            f"Write {total} new, diverse tasks a user could give this agent: {wanted}.",
            DIFFICULTY_SCALE,
            "Rules:",
            "- Use only the tools, tables, columns and values shown above; never invent "
            "tables, columns, people or other entities.",
            "- Each task is one self-contained request in plain language, as a user would "
            "phrase it.",
            "- Each task says what form the answer takes (for example 'Answer with the number "
            "only' or 'List the names, separated by commas').",
            "- Vary the kind of question: counts, sums, averages, filters, rankings, date "
            "ranges, comparisons, questions across several tables.",
        ]
        if avoid:
            lines.append("- Do not repeat or paraphrase these existing tasks:")
            lines.extend(f"  - {a[:150]}" for a in avoid)
        lines.append('Answer as JSON: {"scenarios": [{"task": "...", "difficulty": 1}]}')
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "\n".join(lines)}]

    def tag_entities(self, task: str, vocab: dict[str, str]) -> list[str]:
        low = task.casefold()
        return sorted({label for value, label in vocab.items()
                       if re.search(r"(?<!\w)" + re.escape(value.casefold()) + r"(?!\w)", low)})

    def plan(self, ctx: GenerationContext, batches: int) -> list[dict[int, int]]:
        """Difficulty counts for the next ``batches`` calls, from what the mix still lacks."""

        size = ctx.settings.llm_batch_size
        missing = ctx.missing_by_difficulty()
        need = max(0, ctx.pool_target - len(ctx.accepted))
        if sum(missing.values()) == 0:
            missing = {3: need}
        queue = [d for d in range(1, 6) for _ in range(missing[d])][: max(need, 1)]
        plans = []
        for _ in range(batches):
            chunk, queue = queue[:size], queue[size:]
            if not chunk:
                break
            plans.append({d: chunk.count(d) for d in range(1, 6) if d in chunk})
        return plans

    async def generate(self, ctx: GenerationContext) -> None:
        if ctx.upstream is None:
            raise LlmUnavailableError("no generator LLM configured (GENERATOR_BASE_URL)")
        ctx.progress.phase = "discovering"
        context, vocab = await self.describe_server(ctx)
        s = ctx.settings
        llm = GeneratorLLM(
            ctx.upstream, model=ctx.params.model, mode=ctx.params.json_schema or
            s.generator_json_schema, max_repairs=s.llm_max_repairs, max_tokens=s.llm_max_tokens,
            temperature=s.llm_temperature, task_max_chars=s.llm_task_max_chars,
            progress=ctx.progress, metrics=ctx.metrics, support_cache=ctx.llm_support)
        ctx.model = llm.model
        ctx.progress.phase = "generating"
        failed = 0
        call_no = 0
        max_calls = 3 * math.ceil(ctx.pool_target / s.llm_batch_size) + 2
        try:
            while not ctx.enough() and call_no < max_calls:
                remaining = ctx.pool_target - len(ctx.accepted)
                parallel = min(ctx.upstream.max_concurrency,
                               math.ceil(remaining / s.llm_batch_size), max_calls - call_no)
                plans = self.plan(ctx, max(1, parallel))
                avoid = [a.task for a in ctx.accepted[-AVOID_LAST:]]
                jobs = []
                for counts in plans:
                    seed = ctx.params.seed * 10_000 + call_no
                    call_no += 1
                    jobs.append(llm.ask_batch(self.prompt(context, counts, avoid),
                                              sum(counts.values()), seed))
                results = await asyncio.gather(*jobs, return_exceptions=True)
                fatal: BaseException | None = None
                for result in results:
                    if isinstance(result, LlmOutputError):
                        failed += 1
                        if failed >= s.llm_max_failed_batches:
                            fatal = fatal or result
                        continue
                    if isinstance(result, BaseException):
                        fatal = fatal or result
                        continue
                    for problem in result.dropped:
                        ctx.reject("invalid item")
                        log.debug("dropped item: %s", problem)
                    await ctx.offer([
                        Scenario(id=Scenario.content_id(d.task), task=d.task,
                                 difficulty=d.difficulty, strategy="llm",
                                 entities=self.tag_entities(d.task, vocab),
                                 metadata={"model": llm.model})
                        for d in result.drafts])
                if fatal is not None:
                    raise fatal
            if not ctx.enough():
                ctx.warnings.append(
                    f"stopped after {call_no} generator calls with {len(ctx.accepted)} unique "
                    f"tasks of {ctx.pool_target} wanted")
        finally:
            await llm.close()
