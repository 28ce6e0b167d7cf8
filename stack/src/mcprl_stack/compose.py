"""The compose stack on a Docker engine, driven the way a user drives it, for `make
compose-test` (tests/integration/test_compose_docker.py).

Every call is the ``docker`` CLI with a timeout: ``docker compose -f compose.yaml -f
compose.cpu.yaml ...`` under a project name of its own (so a user's ``mcp-rl`` project and its
volumes are never touched) and with free loopback ports for everything it publishes.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mcprl_common.process import free_port

# Published port variables of compose.yaml, by service.
PORT_VARS = {"mcp-server": "MCP_PORT", "inventory-mcp": "INVENTORY_PORT",
             "inference": "INFERENCE_PORT", "scenario-gen": "SCENARIO_GEN_PORT",
             "judge": "JUDGE_PORT", "trainer": "TRAINER_PORT", "prometheus": "PROMETHEUS_PORT",
             "grafana": "GRAFANA_PORT"}


class DockerError(RuntimeError):
    """A docker command failed; the message carries its command line and output tail."""


def docker(*args: str, timeout_s: float = 120, env: dict[str, str] | None = None,
           cwd: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """``docker ARGS`` with a timeout; raises :class:`DockerError` on failure if ``check``."""

    res = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout_s,
                         env=env, cwd=cwd, check=False)
    if check and res.returncode != 0:
        tail = (res.stdout + res.stderr)[-4000:]
        raise DockerError(f"docker {' '.join(args)} exited {res.returncode}:\n{tail}")
    return res


def engine_reachable() -> str | None:
    """The engine's version, or None when no Docker engine (or no compose plugin) answers."""

    try:
        version = docker("version", "-f", "{{.Server.Version}}", timeout_s=20, check=False)
        compose = docker("compose", "version", timeout_s=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if version.returncode != 0 or compose.returncode != 0:
        return None
    return version.stdout.strip()


@dataclass
class ComposeStack:
    """One compose project of this repository: its files, project name, ports and variables."""

    repo: Path
    project: str = "mcprl-compose-test"
    files: Sequence[str] = ("compose.yaml", "compose.cpu.yaml")
    profiles: Sequence[str] = ("train", "inventory")
    variables: dict[str, str] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for service in PORT_VARS:
            self.ports.setdefault(service, free_port())

    def env(self, **extra: str) -> dict[str, str]:
        """The environment compose interpolates: ours, the ports, then ``extra``."""

        env = {**os.environ, "COMPOSE_PROJECT_NAME": self.project, **self.variables}
        env.update({PORT_VARS[s]: str(p) for s, p in self.ports.items()})
        env.update(extra)
        return env

    def compose(self, *args: str, timeout_s: float = 300, check: bool = True,
                **extra: str) -> subprocess.CompletedProcess[str]:
        files = [a for f in self.files for a in ("-f", f)]
        profiles = [a for p in self.profiles for a in ("--profile", p)]
        return docker("compose", *files, *profiles, *args, timeout_s=timeout_s,
                      env=self.env(**extra), cwd=self.repo, check=check)

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.ports[service]}"

    def image(self, service: str) -> str:
        """The image compose runs for ``service`` (after interpolation)."""

        config = json.loads(self.compose("config", "--format", "json", timeout_s=60).stdout)
        return config["services"][service]["image"]

    def container_ids(self, *, all_states: bool = True) -> list[str]:
        """Containers of this project, running or not (by compose's project label)."""

        label = f"label=com.docker.compose.project={self.project}"
        args = ["ps", "-q", "--filter", label, *(["-a"] if all_states else [])]
        return docker(*args, timeout_s=30).stdout.split()

    def states(self) -> dict[str, dict[str, str]]:
        """Service -> {state, health, exit_code} of its (last) container."""

        out = self.compose("ps", "-a", "--format", "json", timeout_s=60).stdout
        rows = [json.loads(line) for line in out.splitlines() if line.strip()]
        if len(rows) == 1 and isinstance(rows[0], list):  # older compose prints one array
            rows = rows[0]
        return {r["Service"]: {"state": r.get("State", ""), "health": r.get("Health", ""),
                               "exit_code": str(r.get("ExitCode", ""))} for r in rows}

    def wait_exit(self, service: str, timeout_s: float) -> int:
        """Wait for ``service``'s container to stop; its exit code."""

        (cid,) = self.compose("ps", "-a", "-q", service, timeout_s=30).stdout.split()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state = docker("inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", cid,
                           timeout_s=30).stdout.split()
            if state[0] in ("exited", "dead"):
                return int(state[1])
            time.sleep(2)
        raise TimeoutError(f"{service} still running after {timeout_s:.0f}s")

    def logs(self, service: str, tail: int = 200) -> str:
        res = self.compose("logs", "--no-color", "--tail", str(tail), service, timeout_s=60,
                           check=False)
        return res.stdout + res.stderr

    def networks(self) -> list[str]:
        return self._labelled("network")

    def volumes(self) -> list[str]:
        return self._labelled("volume")

    def _labelled(self, kind: str) -> list[str]:
        label = f"label=com.docker.compose.project={self.project}"
        return docker(kind, "ls", "-q", "--filter", label, timeout_s=30).stdout.split()


def image_size_mb(image: str) -> float:
    return int(docker("image", "inspect", "-f", "{{.Size}}", image, timeout_s=30).stdout) / 1e6


def run_in_image(image: str, *command: str, timeout_s: float = 120) -> str:
    """``command`` in a throwaway container of ``image`` (no network); its stdout."""

    return docker("run", "--rm", "--network", "none", "--entrypoint", command[0], image,
                  *command[1:], timeout_s=timeout_s).stdout
