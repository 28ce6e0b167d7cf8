"""LocalStack with real services as child processes: start, health, teardown, failures."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import httpx
import pytest
from fastmcp import Client

from mcprl_stack import LocalStack, StackError, StackSettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
LIGHT = ["mcp-server", "inventory-mcp"]  # no torch: quick to start


def _config(tmp_path: Path, **kwargs: object) -> StackSettings:
    values: dict[str, object] = {"services": LIGHT, "ports": dict.fromkeys(LIGHT, 0),
                                 "runs_dir": tmp_path, "inherit_env": False,
                                 "health_timeout_s": 60}
    values.update(kwargs)
    return StackSettings(**values)


def _refused(url: str) -> bool:
    try:
        httpx.get(url, timeout=2)
    except httpx.ConnectError:
        return True
    return False


async def _tools(url: str) -> list[str]:
    async with Client(url) as client:
        return sorted(t.name for t in await client.list_tools())


def test_start_serves_every_service_and_stop_tears_down(tmp_path: Path) -> None:
    stack = LocalStack(_config(tmp_path))
    with stack:
        for name in LIGHT:
            assert httpx.get(stack.urls[name] + "/healthz", timeout=5).status_code == 200
            assert stack.processes[name].alive
        assert stack.mcp_url == stack.urls["mcp-server"] + "/mcp"
        company = asyncio.run(_tools(stack.urls["mcp-server"] + "/mcp"))
        inventory = asyncio.run(_tools(stack.urls["inventory-mcp"] + "/mcp"))
        assert {"list_tables", "describe_table", "run_query"} <= set(company)
        assert {"search_items", "get_item", "stock_level", "list_warehouses"} <= set(inventory)
        procs = dict(stack.processes)
    for name, proc in procs.items():
        assert proc.proc is not None and proc.proc.poll() is not None, name
        assert _refused(stack.urls[name] + "/healthz")
        log = (tmp_path / "logs" / f"{name}.log").read_text()
        assert "mcprl-stack starts" in log and "Shutting down" in log  # graceful SIGTERM
    assert (tmp_path / "data" / "company.db").exists()
    assert (tmp_path / "data" / "inventory.db").exists()


def test_a_service_that_fails_stops_the_others_and_shows_its_log(tmp_path: Path) -> None:
    stack = LocalStack(_config(tmp_path, env={"MCP_QUERY_TIMEOUT_S": "-1"}))
    with pytest.raises(StackError) as info:
        stack.start()
    message = str(info.value)
    assert "mcp-server failed to start" in message
    assert "query_timeout_s" in message  # the end of its log says why
    assert stack.processes == {}
    assert _refused(stack.urls["inventory-mcp"] + "/healthz")  # its neighbour was stopped


def test_busy_port_is_reported_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        stack = LocalStack(_config(tmp_path, ports={"mcp-server": 0, "inventory-mcp": port}))
        with pytest.raises(StackError, match=f"port {port} .* in use.*INVENTORY_PORT"):
            stack.start()
    assert stack.processes == {}
    assert not (tmp_path / "logs" / "mcp-server.log").exists()


def test_an_auto_assigned_port_found_busy_is_drawn_again() -> None:
    """Six stacks starting at once: the OS's free port can be taken (by another process's
    outgoing connection) before the stack checks it. A drawn port is drawn again; a busy one
    or one this stack already uses is never returned."""

    from mcprl_common.process import free_port
    from mcprl_stack.local_stack import pick_free_port

    with socket.socket() as busy, socket.socket() as mine:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        mine.bind(("127.0.0.1", 0))
        draws = iter([busy.getsockname()[1], mine.getsockname()[1]])
        taken = {mine.getsockname()[1]}

        def probe(host: str) -> int:
            return next(draws, None) or free_port(host)

        port = pick_free_port("127.0.0.1", taken, probe=probe)
        assert port not in (busy.getsockname()[1], mine.getsockname()[1])
        with socket.socket() as check:
            check.bind(("127.0.0.1", port))  # really free
        with pytest.raises(StackError, match="no free port"):
            pick_free_port("127.0.0.1", taken, probe=lambda host: busy.getsockname()[1],
                           attempts=3)


def test_services_run_without_console_scripts(tmp_path: Path, monkeypatch) -> None:
    """A box with the sources on PYTHONPATH but nothing installed (the GPU image): the stack
    falls back to ``python -m <package>``, and names what is missing when that fails too."""

    from mcprl_stack import local_stack

    monkeypatch.setattr(local_stack.sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    assert local_stack.script_command("mcprl-mcp-server") == [
        str(tmp_path / "bin" / "python"), "-m", "mcprl_mcp_server"]
    with pytest.raises(StackError, match="no module 'mcprl_nothing'"):
        local_stack.script_command("mcprl-nothing")
    assert local_stack.script_command("mcprl-train", "mcprl_trainer.cli")[1:] == [
        "-m", "mcprl_trainer.cli"]
