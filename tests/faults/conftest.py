"""Fault tests: the services as real processes on loopback (so they can be SIGKILLed and
restarted on the same port), the tiny-test model, and a `sql` scenario set made through
scenario-gen's HTTP API. One stack per session; a test that kills a service restarts it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from mcprl_common.process import free_port
from mcprl_stack import LocalStack
from mcprl_stack.config import StackSettings
from mcprl_testing.scenario_gen import wait_finished
from mcprl_testing.stack import PIPELINE_ENV
from mcprl_testing.trainer import merge_sections, run_config_data

SERVICES = ("mcp-server", "inference", "scenario-gen", "judge")
# Secrets the stack is given, so tests/faults/test_secrets.py can look for them everywhere.
MCP_TOKEN = "mcp-token-3f9c2a7d51e84b06"
JUDGE_KEY = "sk-judge-7e1d44a0c9b2f358"
GENERATOR_KEY = "sk-gen-19ac6e2b7d0f4a83"


@dataclass
class FaultStack:
    stack: LocalStack
    set_id: str
    runs_dir: Path

    @property
    def urls(self) -> dict[str, str]:
        return self.stack.urls

    @property
    def mcp_url(self) -> str:
        return f"{self.urls['mcp-server']}/mcp"

    @property
    def engine_url(self) -> str:
        return f"{self.urls['inference']}/v1"

    @property
    def base_model(self) -> str:
        assert self.stack.served_model is not None
        return self.stack.served_model

    def run_config(self, tmp_path: Path, name: str, **overrides: Any) -> dict[str, Any]:
        """A small run wired to this stack (verifiable rewards: the judge calls no LLM)."""

        data = run_config_data(
            tmp_path, model=self.base_model, engine_url=self.engine_url, mcp_url=self.mcp_url,
            judge_url=self.urls["judge"], scenario_gen_url=self.urls["scenario-gen"],
            set_id=self.set_id, name=name, steps=3,
            policy={"api_key": "EMPTY"}, mcp={"auth_token": MCP_TOKEN},
            rollout={"max_turns": 3, "max_tokens_per_turn": 32},
            status={"enabled": True, "port": free_port()},
            retry={"window_s": 60, "backoff_max_s": 2})
        return merge_sections(data, overrides)


@pytest.fixture(scope="session")
def stack_secrets() -> dict[str, str]:
    """The secrets the fault stack runs with, by name (what must never leak)."""

    return {"MCP_AUTH_TOKEN": MCP_TOKEN, "JUDGE_API_KEY": JUDGE_KEY,
            "GENERATOR_API_KEY": GENERATOR_KEY}


@pytest.fixture(scope="session")
def fault_stack(tmp_path_factory: pytest.TempPathFactory, tiny_test_model: Path
                ) -> Iterator[FaultStack]:
    runs = tmp_path_factory.mktemp("faults")
    config = StackSettings(
        services=list(SERVICES), ports=dict.fromkeys(SERVICES, 0), model=str(tiny_test_model),
        runs_dir=runs, inherit_env=False, health_timeout_s=120, stop_timeout_s=10,
        env={**PIPELINE_ENV, "MCP_AUTH_TOKEN": MCP_TOKEN, "JUDGE_API_KEY": JUDGE_KEY,
             "GENERATOR_API_KEY": GENERATOR_KEY, "JUDGE_DEFAULT_MODE": "verifiable"},
    )
    stack = LocalStack(config).start()
    try:
        sg = stack.urls["scenario-gen"]
        with httpx.Client(base_url=sg, timeout=30) as client:
            created = client.post("/v1/scenario-sets", json={
                "mcp_url": f"{stack.urls['mcp-server']}/mcp", "auth_token": MCP_TOKEN,
                "strategy": "sql", "n": 12, "val_fraction": 0.25, "seed": 0})
            assert created.status_code == 202, created.text
            set_id = created.json()["id"]
            assert wait_finished(client, set_id, timeout_s=120)["status"] == "succeeded"
        yield FaultStack(stack, set_id, runs)
    finally:
        stack.stop()


# -- the trainer as a real process --------------------------------------------------------------
class TrainerProcess:
    """``mcprl-train`` in its own process group, its log in a file, its status polled."""

    def __init__(self, config: dict[str, Any], tmp_path: Path) -> None:
        self.config = config
        self.path = tmp_path / f"{config['name']}.yaml"
        self.path.write_text(yaml.safe_dump(config))
        self.log = tmp_path / f"{config['name']}.log"
        self.port = config["status"]["port"]
        self.run_dir = Path(config["output_dir"]) / config["name"]
        self.proc: subprocess.Popen | None = None

    def start(self, *extra: str) -> TrainerProcess:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mcprl_trainer.cli", "--config", str(self.path),
             "--no-progress", "--log-json", *extra], stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT, env=env, start_new_session=True)
        return self

    def status(self) -> dict[str, Any] | None:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/v1/status", timeout=1).json()
        except (httpx.HTTPError, ValueError):
            return None

    def metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=2).text

    def wait_for(self, predicate: Callable[[dict[str, Any]], bool], what: str,
                 timeout_s: float = 120) -> dict[str, Any]:
        """Poll the status server until ``predicate(status)``; fail if the trainer exits."""

        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            status = self.status()
            if status is not None and predicate(status):
                return status
            if self.proc.poll() is not None:
                raise AssertionError(f"trainer exited ({self.proc.returncode}) before {what}:\n"
                                     f"{self.tail()}")
            time.sleep(0.02)
        raise AssertionError(f"timed out waiting for {what}:\n{self.tail()}")

    def wait_log(self, text: str, timeout_s: float = 120) -> None:
        """Poll the trainer's log until it contains ``text``."""

        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while text not in self.tail(1_000_000):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} in the trainer's log:\n{self.tail()}")
            time.sleep(0.02)

    def wait(self, timeout_s: float = 240) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired as exc:
            self.kill()
            raise AssertionError(f"trainer still running after {timeout_s}s:\n"
                                 f"{self.tail()}") from exc

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""

    def rows(self, name: str) -> list[dict[str, Any]]:
        path = self.run_dir / name
        return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.fixture
def trainer(tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], TrainerProcess]]:
    started: list[TrainerProcess] = []

    def make(config: dict[str, Any]) -> TrainerProcess:
        proc = TrainerProcess(config, tmp_path)
        started.append(proc)
        return proc

    yield make
    for proc in started:
        proc.kill()
