"""The parity run's trajectory groups: four tasks on the tutorial's database, four attempts
each, built from real tool results of the MCP server, in a known order of quality:
solved directly > solved after a detour > a wrong answer > gave up without one."""

from __future__ import annotations

import json
from typing import Any

import art

from mcprl_trainer.mcp_tools import McpSession, open_session

SYSTEM_PROMPT = ("You are an agent with tools to query a company database. The database "
                 "works: list the tables, describe the ones you need, run SELECT queries, "
                 "then call complete_task with the final answer.")

# task, the table it needs, a right query, a plausible wrong one
TASKS: list[tuple[str, str, str, str]] = [
    ("How many employees work in the Engineering department?", "employees",
     "SELECT COUNT(*) AS n FROM employees e JOIN departments d ON e.department_id = d.id "
     "WHERE d.name = 'Engineering'", "SELECT COUNT(*) AS n FROM employees"),
    ("Which department has the largest budget?", "departments",
     "SELECT name FROM departments ORDER BY budget DESC LIMIT 1",
     "SELECT name FROM departments ORDER BY budget ASC LIMIT 1"),
    ("What is the average salary of the employees hired after 2020?", "employees",
     "SELECT ROUND(AVG(salary), 2) AS avg FROM employees WHERE hire_date > '2020-12-31'",
     "SELECT ROUND(AVG(salary), 2) AS avg FROM employees"),
    ("How many projects are active?", "projects",
     "SELECT COUNT(*) AS n FROM projects WHERE status = 'active'",
     "SELECT COUNT(*) AS n FROM projects"),
]
INTENDED = [3.0, 2.0, 1.0, 0.0]  # best first, as the groups are built


class _Transcript:
    def __init__(self, session: McpSession, task: str) -> None:
        self.session = session
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT},
                                               {"role": "user", "content": task}]
        self.n = 0

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        self.n += 1
        cid = f"call_{self.n}"
        self.messages.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": cid, "type": "function",
             "function": {"name": name, "arguments": json.dumps(arguments)}}]})
        text = "Task completed." if name == "complete_task" else (
            await self.session.call(name, arguments)).text
        self.messages.append({"role": "tool", "tool_call_id": cid, "content": text})
        return text

    def trajectory(self) -> art.Trajectory:
        return art.Trajectory(messages_and_choices=self.messages, tools=self.session.agent_tools())


def _first_value(result: str) -> str:
    rows = json.loads(result).get("results") or [{}]
    return str(next(iter(rows[0].values()), ""))


async def _attempts(session: McpSession, task: str, table: str, right: str, wrong: str
                    ) -> list[art.Trajectory]:
    best = _Transcript(session, task)
    await best.call("list_tables", {})
    await best.call("describe_table", {"table_name": table})
    answer = _first_value(await best.call("run_query", {"sql": right}))
    await best.call("complete_task", {"answer": answer})

    detour = _Transcript(session, task)
    await detour.call("run_query", {"sql": f"SELECT * FROM {table}_data"})  # no such table
    await detour.call("list_tables", {})
    await detour.call("describe_table", {"table_name": "departments"})
    await detour.call("describe_table", {"table_name": table})
    await detour.call("run_query", {"sql": right})
    await detour.call("complete_task", {"answer": answer})

    wrong_one = _Transcript(session, task)
    await wrong_one.call("list_tables", {})
    await wrong_one.call("complete_task", {
        "answer": _first_value(await wrong_one.call("run_query", {"sql": wrong}))})

    gave_up = _Transcript(session, task)
    await gave_up.call("list_tables", {})
    await gave_up.call("describe_table", {"table_name": table})
    return [t.trajectory() for t in (best, detour, wrong_one, gave_up)]


async def build_groups(mcp_url: str) -> tuple[list[art.TrajectoryGroup], list[list[float]]]:
    """The groups (ART shapes) and, per group, the intended scores (higher is better)."""

    groups = []
    async with open_session(mcp_url) as session:
        for task, table, right, wrong in TASKS:
            groups.append(art.TrajectoryGroup(await _attempts(session, task, table, right, wrong),
                                              metadata={"task": task}))
    return groups, [list(INTENDED) for _ in groups]
