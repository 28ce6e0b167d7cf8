"""The company-db MCP server under load: N concurrent clients (64 by default) for a while
(60 s by default), over Streamable HTTP and then over SSE, next to one client alone.

Each client is a real fastmcp Client with its own connection to the server running as a
separate process; it cycles through a mix of list_tables, describe_table (a real table and
an unknown one), valid queries and hostile ones (writes, DDL, ATTACH, multi-statement,
injection). Every call is checked: the valid ones must succeed, the hostile ones must come
back as tool errors (``isError``); anything else (a success where an error was due, an
exception, a dropped connection) is an unexpected error. Clients reconnect now and then, so
sessions are opened and closed under load.

Reported per transport: calls, calls/s, p50/p99 of the valid and the hostile calls with 64
clients and with 1, unexpected errors, the server's memory (RSS) before and after, open
sessions and requests in flight after the clients left (0 = nothing leaked), and whether
the database file is byte-for-byte unchanged. Prints one JSON object; exits 1 when an
unexpected error, a leaked session or a changed database was seen.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from fastmcp import Client

from mcprl_common.process import ServiceProcess, free_port
from mcprl_mcp_server.db.seed import ensure_database

VALID: list[tuple[str, dict[str, Any]]] = [
    ("list_tables", {}),
    ("describe_table", {"table_name": "employees"}),
    ("run_query", {"sql": "SELECT d.name, COUNT(*) FROM employees e JOIN departments d "
                          "ON d.id = e.department_id GROUP BY d.name"}),
    ("run_query", {"sql": "SELECT name, salary FROM employees ORDER BY salary DESC LIMIT 5"}),
    ("run_query", {"sql": "WITH p AS (SELECT * FROM projects WHERE status = 'active') "
                          "SELECT COUNT(*) FROM p"}),
]
HOSTILE: list[tuple[str, dict[str, Any]]] = [
    ("describe_table", {"table_name": "no_such_table"}),
    ("run_query", {"sql": "DELETE FROM employees"}),
    ("run_query", {"sql": "UPDATE employees SET salary = 0"}),
    ("run_query", {"sql": "DROP TABLE projects"}),
    ("run_query", {"sql": "ATTACH DATABASE ':memory:' AS m"}),
    ("run_query", {"sql": "SELECT 1; DELETE FROM departments"}),
    ("run_query", {"sql": "SELECT * FROM employees WHERE name = '' OR 1=1; DROP TABLE x; --"}),
    ("run_query", {"sql": "PRAGMA writable_schema = ON"}),
    ("run_query", {"sql": "SELECT * FROM nowhere"}),
]
RECONNECT_EVERY = 25  # calls per session before a client closes it and opens a new one


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def gauge(base_url: str, name: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + " ") or line.startswith(name + "{"))


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000, 2)


async def load_phase(url: str, clients: int, duration_s: float) -> dict[str, Any]:
    """``clients`` workers for ``duration_s``; latencies by kind and unexpected outcomes."""

    latency: dict[str, list[float]] = {"valid": [], "hostile": []}
    unexpected: list[str] = []
    tool_errors = 0
    sessions_opened = 0
    end = time.perf_counter() + duration_s
    mix = [(t, a, False) for t, a in VALID] + [(t, a, True) for t, a in HOSTILE]

    async def worker(i: int) -> None:
        nonlocal tool_errors, sessions_opened
        k = i
        while time.perf_counter() < end:
            try:
                async with Client(url, timeout=60) as client:
                    sessions_opened += 1
                    for _ in range(RECONNECT_EVERY):
                        if time.perf_counter() >= end:
                            return
                        tool, args, hostile = mix[k % len(mix)]
                        k += 1
                        t0 = time.perf_counter()
                        res = await client.call_tool(tool, args, raise_on_error=False)
                        latency["hostile" if hostile else "valid"].append(
                            time.perf_counter() - t0)
                        if res.is_error != hostile:
                            text = res.content[0].text if res.content else ""
                            unexpected.append(f"{tool}({json.dumps(args)[:60]}): "
                                              f"is_error={res.is_error} {text[:120]}")
                        tool_errors += bool(res.is_error)
            except Exception as exc:  # a dropped connection, a refused session, a timeout
                unexpected.append(f"{type(exc).__name__}: {str(exc)[:200]}")

    started = time.perf_counter()
    await asyncio.gather(*(worker(i) for i in range(clients)))
    wall = time.perf_counter() - started
    calls = len(latency["valid"]) + len(latency["hostile"])
    return {
        "clients": clients,
        "seconds": round(wall, 2),
        "calls": calls,
        "calls_per_s": round(calls / wall, 1) if wall else 0.0,
        "sessions_opened": sessions_opened,
        "intended_tool_errors": tool_errors,
        "unexpected_errors": len(unexpected),
        "unexpected_examples": unexpected[:5],
        "valid_p50_ms": pct(latency["valid"], 0.5),
        "valid_p99_ms": pct(latency["valid"], 0.99),
        "hostile_p50_ms": pct(latency["hostile"], 0.5),
        "hostile_p99_ms": pct(latency["hostile"], 0.99),
        "mean_ms": round(statistics.fmean(latency["valid"] + latency["hostile"]) * 1000, 2)
        if calls else None,
    }


def settle(base: str, timeout_s: float = 10.0) -> dict[str, float]:
    """Open sessions and requests in flight once the clients are gone (polled to 0)."""

    deadline = time.monotonic() + timeout_s
    while True:
        now = {"active_sessions": gauge(base, "mcprl_mcp_active_sessions"),
               "requests_in_flight": gauge(base, "mcprl_mcp_requests_in_flight")}
        if not any(now.values()) or time.monotonic() > deadline:
            return now
        time.sleep(0.1)


def run(clients: int, duration_s: float, baseline_s: float, transports: list[str]
        ) -> dict[str, Any]:
    out: dict[str, Any] = {"bench": "mcp_load", "clients": clients, "duration_s": duration_s,
                           "machine": {"cpus": os.cpu_count(),
                                       "load_avg_1m_before": round(os.getloadavg()[0], 2)},
                           "transports": {}}
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "company.db"
        ensure_database(db, "default", 42)
        digest = sha256(db)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        server = ServiceProcess(
            "mcp-server", [sys.executable, "-m", "mcprl_mcp_server"],
            env={"MCP_PORT": str(port), "MCP_DB_PATH": str(db), "MCP_LOG_LEVEL": "warning"},
            health_url=f"{base}/healthz", log_path=Path(tmp) / "server.log")
        with server:
            assert server.proc is not None
            for transport in transports:
                url = f"{base}/mcp" if transport == "http" else f"{base}/sse"
                rss_before = rss_bytes(server.proc.pid)
                alone = asyncio.run(load_phase(url, 1, baseline_s))
                loaded = asyncio.run(load_phase(url, clients, duration_s))
                after = settle(base)
                out["transports"][transport] = {
                    "one_client": alone,
                    "loaded": loaded,
                    "rss_bytes_before": rss_before,
                    "rss_bytes_after": rss_bytes(server.proc.pid),
                    "after_clients_left": after,
                    "healthy_after": httpx.get(f"{base}/healthz", timeout=10).status_code == 200,
                }
        out["db_unchanged"] = sha256(db) == digest
    out["machine"]["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    out["ok"] = out["db_unchanged"] and all(
        t["loaded"]["unexpected_errors"] == 0 and t["one_client"]["unexpected_errors"] == 0
        and not any(t["after_clients_left"].values()) and t["healthy_after"]
        for t in out["transports"].values())
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per transport")
    parser.add_argument("--baseline", type=float, default=5.0,
                        help="seconds of the one-client run per transport")
    parser.add_argument("--transports", default="http,sse")
    args = parser.parse_args()
    result = run(args.clients, args.duration, args.baseline, args.transports.split(","))
    print(json.dumps(result, indent=2))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
