"""Tool-call latency and throughput of the company-db MCP server, side by side with the floor.

For 1, 8 and 64 concurrent clients, each a real fastmcp Client with its own connection over
Streamable HTTP to the server running as a separate process (``python -m mcprl_mcp_server``),
cycling through the same mix of tool calls (list_tables, describe_table, a JOIN/GROUP BY
query, a WITH query, a date filter). The floor runs the same SQL directly on sqlite3 in this
process (one connection per thread, same thread counts); a middle row runs it through the
server's read-only layer without HTTP, to show what the guard itself costs.

Client and server share this machine's cores, so "calls/s" is end-to-end capacity on the
box, not the server alone. Prints one JSON object. ``--quick`` runs shorter phases.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastmcp import Client

from mcprl_common.process import ServiceProcess, free_port
from mcprl_mcp_server.db.readonly import ReadOnlyDatabase
from mcprl_mcp_server.db.seed import ensure_database

JOIN_SQL = (
    "SELECT d.name, COUNT(*) AS n, ROUND(AVG(e.salary), 2) AS avg_salary FROM employees e "
    "JOIN departments d ON d.id = e.department_id GROUP BY d.name ORDER BY n DESC"
)
WITH_SQL = (
    "WITH active AS (SELECT * FROM projects WHERE status = 'active') "
    "SELECT e.name, SUM(a.budget) AS total FROM active a JOIN employees e ON e.id = a.lead_id "
    "GROUP BY e.name ORDER BY total DESC LIMIT 5"
)
DATE_SQL = (
    "SELECT strftime('%Y', hire_date) AS year, COUNT(*) AS hires FROM employees "
    "WHERE hire_date >= '2018-01-01' GROUP BY year ORDER BY year"
)
# (tool, arguments) and the equivalent direct SQL for the in-process floor
MIX: list[tuple[str, dict[str, str], list[str]]] = [
    ("list_tables", {}, ["SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY rowid"]),
    ("describe_table", {"table_name": "employees"},
     ["PRAGMA table_info(employees)", "PRAGMA foreign_key_list(employees)",
      "SELECT sql FROM sqlite_master WHERE name = 'employees'", "SELECT count(*) FROM employees"]),
    ("run_query", {"sql": JOIN_SQL}, [JOIN_SQL]),
    ("run_query", {"sql": WITH_SQL}, [WITH_SQL]),
    ("run_query", {"sql": DATE_SQL}, [DATE_SQL]),
]  # fmt: skip


def summarize(latencies_s: list[float], wall_s: float, errors: int) -> dict[str, Any]:
    lat = sorted(x * 1000 for x in latencies_s)
    if not lat:
        return {"calls": 0, "errors": errors}
    return {
        "calls": len(lat),
        "errors": errors,
        "p50_ms": round(statistics.median(lat), 3),
        "p99_ms": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 3),
        "mean_ms": round(statistics.fmean(lat), 3),
        "calls_per_s": round(len(lat) / wall_s, 1),
    }


async def mcp_phase(url: str, clients: int, duration_s: float) -> dict[str, Any]:
    latencies: list[float] = []
    errors = 0
    sessions = [Client(url, timeout=60) for _ in range(clients)]
    await asyncio.gather(*(c.__aenter__() for c in sessions))
    try:
        # warm-up: every client makes one call before timing starts
        await asyncio.gather(*(c.call_tool("list_tables", {}) for c in sessions))
        start = time.perf_counter()
        end = start + duration_s

        async def worker(i: int, client: Client) -> None:
            nonlocal errors
            k = i
            while time.perf_counter() < end:
                tool, args, _ = MIX[k % len(MIX)]
                k += 1
                t0 = time.perf_counter()
                res = await client.call_tool(tool, args, raise_on_error=False)
                latencies.append(time.perf_counter() - t0)
                errors += bool(res.is_error)

        await asyncio.gather(*(worker(i, c) for i, c in enumerate(sessions)))
        wall = time.perf_counter() - start
    finally:
        await asyncio.gather(*(c.__aexit__(None, None, None) for c in sessions),
                             return_exceptions=True)  # fmt: skip
    return summarize(latencies, wall, errors)


def thread_phase(make_call: Callable[[], Callable[[int], None]], threads: int,
                 duration_s: float) -> dict[str, Any]:  # fmt: skip
    """``make_call`` builds a per-thread caller (own connection); call(i) runs mix item i."""

    latencies: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(threads + 1)
    end_box: list[float] = []

    def run(i: int) -> None:
        call = make_call()
        call(i)  # warm-up
        local: list[float] = []
        barrier.wait()
        end = end_box[0]
        k = i
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            call(k)
            local.append(time.perf_counter() - t0)
            k += 1
        with lock:
            latencies.extend(local)

    pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    start = time.perf_counter()
    end_box.append(start + duration_s)
    barrier.wait()
    for t in pool:
        t.join()
    return summarize(latencies, time.perf_counter() - start, 0)


def sqlite_caller(db: Path) -> Callable[[], Callable[[int], None]]:
    def make() -> Callable[[int], None]:
        conn = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, check_same_thread=False)

        def call(i: int) -> None:
            for sql in MIX[i % len(MIX)][2]:
                conn.execute(sql).fetchall()

        return call

    return make


def layer_caller(db: ReadOnlyDatabase) -> Callable[[], Callable[[int], None]]:
    def make() -> Callable[[int], None]:
        def call(i: int) -> None:
            tool, args, _ = MIX[i % len(MIX)]
            if tool == "list_tables":
                db.tables()
            elif tool == "describe_table":
                db.describe(args["table_name"])
            else:
                db.query(args["sql"]).as_dict()

        return call

    return make


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short phases (CI smoke run)")
    parser.add_argument("--concurrency", default="1,8,64", help="comma-separated client counts")
    args = parser.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    load_before = round(os.getloadavg()[0], 2)  # other work on the box skews every figure
    mcp_s, floor_s = (1.5, 0.5) if args.quick else (5.0, 1.5)

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "company.db"
        ensure_database(db, "default", 42)
        port = free_port()
        env = {"MCP_PORT": str(port), "MCP_DB_PATH": str(db), "MCP_LOG_LEVEL": "warning",
               "MCP_MAX_CONCURRENT_QUERIES": "8"}  # fmt: skip
        server = ServiceProcess("mcp-server", [sys.executable, "-m", "mcprl_mcp_server"],
                                env=env, health_url=f"http://127.0.0.1:{port}/healthz",
                                log_path=Path(tmp) / "server.log")  # fmt: skip
        results: dict[str, dict[str, Any]] = {"mcp_streamable_http": {},
                                              "readonly_layer_in_process": {},
                                              "sqlite3_in_process": {}}  # fmt: skip
        with server:
            url = f"http://127.0.0.1:{port}/mcp"
            for n in levels:
                results["mcp_streamable_http"][str(n)] = asyncio.run(mcp_phase(url, n, mcp_s))
        layer = ReadOnlyDatabase(db)
        for n in levels:
            results["readonly_layer_in_process"][str(n)] = thread_phase(
                layer_caller(layer), n, floor_s
            )
            results["sqlite3_in_process"][str(n)] = thread_phase(sqlite_caller(db), n, floor_s)
        layer.close()

    ratio = {
        str(n): round(results["mcp_streamable_http"][str(n)]["p50_ms"]
                      / results["sqlite3_in_process"][str(n)]["p50_ms"], 1)
        for n in levels
    }  # fmt: skip
    print(json.dumps({
        "bench": "mcp_server",
        "mode": "quick" if args.quick else "full",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "sqlite": sqlite3.sqlite_version,
                    "load_avg_1m_before": load_before,
                    "load_avg_1m_after": round(os.getloadavg()[0], 2)},
        "mix": [f"{tool}({json.dumps(a)[:40]})" for tool, a, _ in MIX],
        "phase_s": {"mcp": mcp_s, "in_process": floor_s},
        "results": results,
        "p50_ratio_mcp_vs_sqlite3": ratio,
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
