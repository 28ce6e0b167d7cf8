"""``mcprl-stack``: up until SIGTERM/SIGINT, teardown when a service dies, env output."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]
SCRIPT = str(Path(sys.executable).parent / "mcprl-stack")


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(tmp_path: Path) -> tuple[subprocess.Popen, str, int]:
    env = {**os.environ, "STACK_RUNS_DIR": str(tmp_path), "STACK_INHERIT_ENV": "false",
           "STACK_PORTS": json.dumps({"inventory-mcp": 0})}
    # Ctrl-C's default disposition in the child, whatever this process inherited: a shell
    # starts background jobs with SIGINT ignored, and an ignored SIGINT survives exec.
    proc = subprocess.Popen([SCRIPT, "up", "--services", "inventory-mcp"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_default_sigint)
    assert proc.stdout is not None
    lines = []
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.startswith("up;"):
            text = "".join(lines)
            match = re.search(r"inventory-mcp\s+(http://\S+)\s+pid (\d+)", text)
            assert match, text
            return proc, match.group(1), int(match.group(2))
    proc.kill()
    pytest.fail("mcprl-stack did not come up:\n" + "".join(lines))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    # a zombie that its parent has not reaped yet also counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(") ")[1].startswith("Z")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_up_runs_until_signalled_then_stops_every_service(tmp_path: Path, sig: int) -> None:
    proc, url, pid = _start(tmp_path)
    assert httpx.get(url + "/healthz", timeout=5).status_code == 200
    proc.send_signal(sig)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert "stopped: inventory-mcp" in out
    assert _gone(pid)
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/healthz", timeout=2)
    assert "Shutting down" in (tmp_path / "logs" / "inventory-mcp.log").read_text()


def test_a_dying_service_takes_the_stack_down_with_an_error(tmp_path: Path) -> None:
    proc, _, pid = _start(tmp_path)
    os.kill(pid, signal.SIGKILL)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "inventory-mcp exited with -9" in out


def test_env_prints_the_wiring_with_secrets_masked(tmp_path: Path) -> None:
    env = {**os.environ, "STACK_RUNS_DIR": str(tmp_path),
           "STACK_ENV": json.dumps({"JUDGE_API_KEY": "sk-not-printed-123"})}
    out = subprocess.run([SCRIPT, "env", "judge"], env=env, capture_output=True, text=True,
                         timeout=30, check=True).stdout
    assert "JUDGE_BASE_URL=http://127.0.0.1:8000/v1" in out
    assert "JUDGE_PORT=8920" in out
    assert "JUDGE_API_KEY=***" in out
    assert "sk-not-printed" not in out


def test_bad_config_is_a_clear_error() -> None:
    res = subprocess.run([SCRIPT, "up", "--services", "mcp-server,vllm"], capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 2
    assert "unknown service" in res.stderr and "vllm" in res.stderr
