"""The three tools through a real fastmcp Client over Streamable HTTP and SSE: discovery,
descriptions of every table, and multi-table questions whose answers are checked against
an independent computation from the raw rows read with sqlite3."""

from __future__ import annotations

import datetime as dt
import statistics
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from fastmcp import Client

from mcprl_testing.mcp_server import read_sql, tool_error, tool_json

pytestmark = pytest.mark.timeout(60)


async def query(client: Client, sql: str) -> dict:
    return tool_json(await client.call_tool("run_query", {"sql": sql}, raise_on_error=False))


async def test_lists_the_three_tools_with_helpful_descriptions(client: Client) -> None:
    tools = {t.name: t for t in await client.list_tools()}
    assert set(tools) == {"list_tables", "describe_table", "run_query"}
    assert "describe_table" in tools["list_tables"].description
    assert "list_tables" in tools["describe_table"].description
    assert "SELECT" in tools["run_query"].description
    assert "sql" in tools["run_query"].inputSchema["properties"]
    assert all(t.annotations and t.annotations.readOnlyHint for t in tools.values())


async def test_list_tables_is_a_json_array(client: Client) -> None:
    result = await client.call_tool("list_tables", {})
    assert tool_json(result) == ["departments", "employees", "projects"]
    assert result.data == ["departments", "employees", "projects"]


@pytest.mark.parametrize("table", ["departments", "employees", "projects"])
async def test_describe_each_table(client: Client, db_path: Path, table: str) -> None:
    desc = tool_json(await client.call_tool("describe_table", {"table_name": table}))
    assert desc["table"] == table
    assert desc["row_count"] == read_sql(db_path, f"SELECT count(*) FROM {table}")[0][0]
    info = read_sql(db_path, f"PRAGMA table_info({table})")
    assert [c["name"] for c in desc["columns"]] == [r[1] for r in info]
    assert set(desc["columns"][0]) == {"name", "type", "nullable", "primary_key", "default"}
    assert desc["columns"][0]["primary_key"] is True and desc["columns"][0]["nullable"] is False
    fks = {(f["column"], f["references_table"], f["references_column"])
           for f in desc["foreign_keys"]}  # fmt: skip
    expected = {
        "departments": set(),
        "employees": {("department_id", "departments", "id")},
        "projects": {("department_id", "departments", "id"), ("lead_id", "employees", "id")},
    }[table]
    assert fks == expected
    if table == "projects":
        assert any("on_hold" in c and "status" in c for c in desc["checks"])
        lead = next(c for c in desc["columns"] if c["name"] == "lead_id")
        assert lead["nullable"] is True


async def test_describe_unknown_table_names_the_tables(client: Client) -> None:
    msg = tool_error(
        await client.call_tool("describe_table", {"table_name": "staff"}, raise_on_error=False)
    )
    assert "staff" in msg and "employees" in msg and "list_tables" in msg


async def test_headcount_by_location(client: Client, db_path: Path) -> None:
    got = await query(
        client,
        "SELECT d.location, COUNT(*) AS n FROM employees e "
        "JOIN departments d ON d.id = e.department_id GROUP BY d.location ORDER BY d.location",
    )
    location = dict(read_sql(db_path, "SELECT id, location FROM departments"))
    expected = Counter(location[dept] for (dept,) in
                       read_sql(db_path, "SELECT department_id FROM employees"))  # fmt: skip
    assert got["columns"] == ["location", "n"]
    assert {r["location"]: r["n"] for r in got["results"]} == dict(expected)
    assert len(expected) >= 3  # the default preset spans several cities
    assert got["row_count"] == len(expected) and got["truncated"] is False
    assert isinstance(got["elapsed_ms"], float)


async def test_average_salary_per_department_hired_since_2020(
    client: Client, db_path: Path
) -> None:
    got = await query(
        client,
        "SELECT d.name, ROUND(AVG(e.salary), 2) AS avg_salary, COUNT(*) AS hires "
        "FROM employees e JOIN departments d ON d.id = e.department_id "
        "WHERE strftime('%Y', e.hire_date) >= '2020' GROUP BY d.name",
    )
    names = dict(read_sql(db_path, "SELECT id, name FROM departments"))
    salaries: dict[str, list[float]] = defaultdict(list)
    for dept, salary, hired in read_sql(
        db_path, "SELECT department_id, salary, hire_date FROM employees"
    ):
        if dt.date.fromisoformat(hired).year >= 2020:
            salaries[names[dept]].append(salary)
    assert {r["name"]: r["hires"] for r in got["results"]} == {
        k: len(v) for k, v in salaries.items()
    }
    for row in got["results"]:
        assert row["avg_salary"] == pytest.approx(statistics.mean(salaries[row["name"]]), abs=0.01)


async def test_active_project_budget_by_lead_department(client: Client, db_path: Path) -> None:
    """Three tables: projects -> lead (employees) -> the lead's department."""

    got = await query(
        client,
        "SELECT d.name AS lead_department, SUM(p.budget) AS total, COUNT(*) AS n "
        "FROM projects p JOIN employees e ON e.id = p.lead_id "
        "JOIN departments d ON d.id = e.department_id "
        "WHERE p.status = 'active' GROUP BY d.name ORDER BY total DESC",
    )
    dept_of = dict(read_sql(db_path, "SELECT id, department_id FROM employees"))
    names = dict(read_sql(db_path, "SELECT id, name FROM departments"))
    totals: dict[str, float] = defaultdict(float)
    for lead, status, budget in read_sql(db_path, "SELECT lead_id, status, budget FROM projects"):
        if status == "active" and lead is not None:
            totals[names[dept_of[lead]]] += budget
    assert {r["lead_department"]: r["total"] for r in got["results"]} == pytest.approx(totals)
    assert [r["total"] for r in got["results"]] == sorted(totals.values(), reverse=True)


async def test_projects_without_lead_and_status_mix(client: Client, db_path: Path) -> None:
    got = await query(
        client,
        "SELECT p.status, COUNT(*) AS n, SUM(p.lead_id IS NULL) AS no_lead "
        "FROM projects p LEFT JOIN employees e ON e.id = p.lead_id GROUP BY p.status",
    )
    rows = read_sql(db_path, "SELECT status, lead_id FROM projects")
    assert {r["status"]: r["n"] for r in got["results"]} == dict(Counter(s for s, _ in rows))
    no_lead = Counter(s for s, lead in rows if lead is None)
    assert {r["status"]: r["no_lead"] for r in got["results"]} == {
        s: no_lead.get(s, 0) for s in {s for s, _ in rows}
    }
    assert set(Counter(s for s, _ in rows)) == {"active", "completed", "on_hold"}


async def test_with_queries_work_including_recursive(client: Client, db_path: Path) -> None:
    got = await query(
        client,
        "WITH dept_avg AS (SELECT department_id, AVG(salary) AS a FROM employees "
        "GROUP BY department_id) SELECT COUNT(*) AS above FROM employees e "
        "JOIN dept_avg USING (department_id) WHERE e.salary > dept_avg.a",
    )
    rows = read_sql(db_path, "SELECT department_id, salary FROM employees")
    by: dict[int, list[float]] = defaultdict(list)
    for dept, salary in rows:
        by[dept].append(salary)
    assert got["results"] == [
        {"above": sum(1 for d, s in rows if s > statistics.mean(by[d]))}
    ]
    rec = await query(
        client,
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 10) "
        "SELECT SUM(x) AS s FROM n",
    )
    assert rec["results"] == [{"s": 55}]


async def test_row_cap_marks_truncated(client: Client) -> None:
    got = await query(client, "SELECT a.id, b.id FROM employees a CROSS JOIN employees b")
    assert got["truncated"] is True
    assert got["row_count"] == len(got["results"]) == 1000
    assert got["columns"] == ["id", "id"] and set(got["results"][0]) == {"id", "id_2"}
