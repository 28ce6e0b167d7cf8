"""bench/bench_mcp_load.py, bounded: 64 clients for 4 s per transport (Streamable HTTP, SSE)
mixing valid and hostile calls against the server as a real process. No unexpected error, no
session or request left open afterwards, the database file unchanged. Cost: ~20 s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.faults, pytest.mark.timeout(180)]


def test_64_clients_over_both_transports() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_mcp_load.py"), "--clients", "64",
         "--duration", "4", "--baseline", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=170)
    result = json.loads(proc.stdout)
    assert proc.returncode == 0 and result["ok"], proc.stdout[-4000:] + proc.stderr[-2000:]
    assert result["db_unchanged"] is True
    assert set(result["transports"]) == {"http", "sse"}
    for name, t in result["transports"].items():
        loaded = t["loaded"]
        assert loaded["clients"] == 64 and loaded["sessions_opened"] >= 64, name
        assert loaded["unexpected_errors"] == 0, (name, loaded)
        assert 0 < loaded["intended_tool_errors"] < loaded["calls"], name  # both kinds ran
        assert loaded["valid_p50_ms"] is not None and loaded["hostile_p99_ms"] is not None
        assert t["after_clients_left"] == {"active_sessions": 0.0, "requests_in_flight": 0.0}
        assert t["healthy_after"] is True
        # 64 sessions come and go; what stays behind is bounded (allocator caches, not leaks)
        assert t["rss_bytes_after"] - t["rss_bytes_before"] < 150 * 1024 * 1024, (name, t)
