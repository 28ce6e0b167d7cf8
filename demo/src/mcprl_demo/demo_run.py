"""The demo, stage by stage: stack up, scenario set, trainer run (eval, GRPO steps, eval),
report, and everything down again whatever happens.

Every service is a real local process (``mcprl_stack.LocalStack``; the trainer a child
process of its own), each in its own process group, so stopping them leaves nothing behind;
:attr:`DemoOutcome.pids` lists every process the demo started, for the tests to check.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from mcprl_common.process import ServiceProcess, free_port
from mcprl_demo.config import LoadedConfig

STACK_SERVICES = ["mcp-server", "inference", "scenario-gen", "judge"]
# Variables the trainer would read over its YAML (config env aliases): the demo wires the
# trainer through the YAML alone, so a stray variable in the user's shell cannot rewire it.
TRAINER_ENV_DROP = ("POLICY_BASE_URL", "POLICY_MODEL", "POLICY_API_KEY", "MCP_URL",
                    "MCP_AUTH_TOKEN", "JUDGE_URL", "SCENARIO_GEN_URL")


class DemoError(RuntimeError):
    """A stage failed; the message says which and where its log is."""


@dataclass
class DemoOutcome:
    report: dict[str, Any]
    paths: dict[str, Path]
    seconds: dict[str, float]
    set_id: str
    hosted: bool
    strategy: str
    pids: list[int] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)


class Events:
    """What the demo run tells the display (the CLI shows it with rich; tests collect it)."""

    def stage(self, name: str) -> None: ...
    def info(self, text: str) -> None: ...
    def trainer_status(self, status: dict[str, Any]) -> None: ...


def _root() -> Path:
    return Path.cwd()


def resolve_model(model: str) -> str:
    """A local folder as an absolute path (children run elsewhere); a HF id unchanged."""

    path = Path(model)
    if path.exists():
        return str(path.resolve())
    if model.startswith((".", "/")) or model.count("/") > 1:
        raise DemoError(f"model {model!r} does not exist (run `make warm-start`, or pass a "
                        "HF model id with --model)")
    return model


class DemoRun:
    def __init__(self, config: LoadedConfig, events: Events | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.config = config
        self.events = events or Events()
        self.env = dict(os.environ if env is None else env)
        self.out = config.demo.output_dir.resolve()
        self.seconds: dict[str, float] = {}
        self.pids: list[int] = []
        self.ports: list[int] = []

    # -- stages --------------------------------------------------------------------------------
    def _timed(self, name: str, fn: Callable[[], Any]) -> Any:
        self.events.stage(name)
        started = time.perf_counter()
        try:
            return fn()
        finally:
            self.seconds[name] = round(time.perf_counter() - started, 2)

    def _stack_env(self) -> dict[str, str]:
        demo = self.config.demo
        env = {"MCP_DB_PRESET": demo.db_preset, "MCP_DB_SEED": str(demo.db_seed),
               "INFERENCE_LOG_LEVEL": "warning", "MCP_LOG_LEVEL": "warning",
               "JUDGE_LOG_LEVEL": "warning", "SCENARIO_GEN_LOG_LEVEL": "warning"}
        if self.config.hosted and not self.env.get("GENERATOR_BASE_URL"):
            # One hosted provider for both LLM roles unless the user set the generator apart.
            env["GENERATOR_BASE_URL"] = self.env["JUDGE_BASE_URL"]
            env["GENERATOR_API_KEY"] = self.env["JUDGE_API_KEY"]
            if self.env.get("JUDGE_MODEL"):
                env["GENERATOR_MODEL"] = self.env["JUDGE_MODEL"]
        return env

    def start_stack(self, model: str):
        from mcprl_stack import LocalStack, StackSettings

        config = StackSettings(
            services=STACK_SERVICES, ports=dict.fromkeys(STACK_SERVICES, 0),
            runs_dir=self.out / "stack", model=model, env=self._stack_env(), inherit_env=True,
            health_timeout_s=self.config.demo.health_timeout_s,
        )
        stack = LocalStack(config)
        try:
            stack.start()
        finally:  # record what was started even when a later service failed
            self.pids += [p.proc.pid for p in stack.processes.values() if p.proc is not None]
            self.ports += list(stack.ports.values())
        return stack

    def make_scenarios(self, stack) -> tuple[str, dict[str, int]]:
        """Ask scenario-gen for a set and wait until it is stored."""

        demo = self.config.demo
        url = stack.urls["scenario-gen"] + "/v1/scenario-sets"
        body = {"mcp_url": stack.mcp_url, "strategy": self.config.strategy, "n": demo.scenarios,
                "seed": demo.seed, "val_fraction": demo.val_fraction,
                "holdout_entities": demo.holdout_entities and self.config.strategy == "sql",
                "holdout_templates": demo.holdout_templates}
        with httpx.Client(timeout=60.0) as client:
            resp = client.post(url, json=body)
            if resp.status_code >= 400:
                raise DemoError(f"scenario-gen refused the request: {resp.text[:500]}")
            set_id = resp.json()["id"]
            deadline = time.monotonic() + demo.scenario_timeout_s
            while True:
                status = client.get(f"{url}/{set_id}").json()
                if status["status"] == "succeeded":
                    counts = status.get("manifest", {}).get("counts", {})
                    self.events.info(f"scenario set {set_id}: {counts.get('train', '?')} train "
                                     f"/ {counts.get('val', '?')} val ({self.config.strategy})")
                    return set_id, counts
                if status["status"] in ("failed", "cancelled"):
                    raise DemoError(f"scenario generation {status['status']}: "
                                    f"{status.get('error')}")
                if time.monotonic() > deadline:
                    raise DemoError(f"scenario generation not done after "
                                    f"{demo.scenario_timeout_s:.0f}s")
                time.sleep(0.5)

    def trainer_config(self, stack, model: str, set_id: str) -> dict[str, Any]:
        t = json.loads(json.dumps(self.config.trainer))  # deep copy, plain types
        t["model"] = model
        t.setdefault("name", "demo")
        t["output_dir"] = str(self.out / "train")
        steps = int(t.get("steps", 8))
        t.setdefault("eval", {})["every"] = max(1, steps)  # before (step 0) and after
        t["scenarios"] = {**(t.get("scenarios") or {}), "url": stack.urls["scenario-gen"],
                          "set_id": set_id}
        t["policy"] = {**(t.get("policy") or {}), "base_url": stack.urls["inference"] + "/v1",
                       "model": stack.served_model or model}
        t["mcp"] = {**(t.get("mcp") or {}), "url": stack.mcp_url}
        t["judge"] = {**(t.get("judge") or {}), "url": stack.urls["judge"]}
        t["status"] = {"enabled": True, "host": "127.0.0.1", "port": free_port()}
        return t

    def run_trainer(self, config: dict[str, Any]) -> dict[str, Path]:
        path = self.out / "trainer.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        run_dir = Path(config["output_dir"]) / config["name"]
        if run_dir.exists():  # a fresh run each time (the demo is not resumable)
            import shutil

            shutil.rmtree(run_dir)
        env = {k: v for k, v in self.env.items()
               if k not in TRAINER_ENV_DROP and not k.startswith("TRAINER_")}
        env.update({"HF_HUB_OFFLINE": self.env.get("HF_HUB_OFFLINE", "1"),
                    "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"})
        from mcprl_stack.local_stack import script_command

        status_url = f"http://127.0.0.1:{config['status']['port']}"
        proc = ServiceProcess("trainer", [*script_command("mcprl-train", "mcprl_trainer.cli"),
                                          "--config", str(path), "--no-progress"],
                              log_path=self.out / "stack" / "logs" / "trainer.log",
                              cwd=_root())
        proc.env = {**env}  # replace, not merge: the dropped names must stay dropped
        self.ports.append(config["status"]["port"])
        proc.start()
        assert proc.proc is not None
        self.pids.append(proc.proc.pid)
        try:
            self._follow(proc, status_url)
            code = proc.proc.wait()
        finally:
            proc.stop()
        if code != 0:
            raise DemoError(f"the trainer exited with {code}; see "
                            f"{self.out / 'stack' / 'logs' / 'trainer.log'}")
        return {"html": run_dir / "report.html", "json": run_dir / "report.json",
                "md": run_dir / "report.md", "png": run_dir / "reward_curve.png",
                "run_dir": run_dir}

    def _follow(self, proc: ServiceProcess, status_url: str) -> None:
        deadline = time.monotonic() + self.config.demo.run_timeout_s
        with httpx.Client(timeout=2.0) as client:
            while proc.alive:
                if time.monotonic() > deadline:
                    raise DemoError(f"the trainer did not finish within "
                                    f"{self.config.demo.run_timeout_s:.0f}s")
                with contextlib.suppress(httpx.HTTPError, ValueError):
                    self.events.trainer_status(client.get(f"{status_url}/v1/status").json())
                time.sleep(0.5)

    # -- the whole demo ------------------------------------------------------------------------
    def run(self) -> DemoOutcome:
        self.out.mkdir(parents=True, exist_ok=True)
        model = resolve_model(self.config.demo.model)
        stack = self._timed("start services", lambda: self.start_stack(model))
        try:
            set_id, counts = self._timed("scenarios", lambda: self.make_scenarios(stack))
            trainer = self.trainer_config(stack, model, set_id)
            paths = self._timed("train", lambda: self.run_trainer(trainer))
        finally:
            self._timed("stop services", stack.stop)
        report = json.loads(paths["json"].read_text())
        return DemoOutcome(report=report, paths=paths, seconds=self.seconds, set_id=set_id,
                           hosted=self.config.hosted, strategy=self.config.strategy,
                           pids=self.pids, ports=self.ports, counts=counts)
