"""``LocalStack``: start the selected services as child processes in dependency order,
wait for each to be healthy, and always tear everything down.

Each service runs in its own process group (``mcprl_common.process.ServiceProcess``) with
its output in ``<runs_dir>/logs/<name>.log``; stopping sends SIGTERM (graceful shutdown),
then SIGKILL after the grace period. Services of one dependency level start in parallel.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

import httpx

from mcprl_common.process import ServiceProcess, free_port
from mcprl_stack.config import StackSettings
from mcprl_stack.services import MCP_SERVERS, SERVICES, service_env, start_order

log = logging.getLogger(__name__)
# Names the stack decides whatever the caller's environment says.
_WIRING_SUFFIXES = ("HOST", "PORT")


class StackError(RuntimeError):
    """A service could not start (the message carries the end of its log)."""


def script_command(script: str, module: str | None = None) -> list[str]:
    """The console script next to this interpreter (the venv), else on PATH, else its module
    run as ``python -m`` (a box that has the sources on PYTHONPATH but nothing installed;
    ``module`` defaults to the script's name with underscores)."""

    local = Path(sys.executable).parent / script
    if local.exists():
        return [str(local)]
    found = shutil.which(script)
    if found is not None:
        return [found]
    module = module or script.replace("-", "_")
    if importlib.util.find_spec(module) is not None:
        return [sys.executable, "-m", module]
    raise StackError(f"console script {script!r} not found and no module {module!r}: is its "
                     "package installed (make setup)?")


def _port_busy(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def pick_free_port(host: str, taken: set[int], probe: Callable[[str], int] = free_port,
                   attempts: int = 20) -> int:
    """A port the OS calls free, not yet ``taken`` by this stack and not busy a moment later.

    An ephemeral port can be handed to another process's outgoing connection between the
    OS's answer and our check (six learning-run stacks starting at once hit this), so an
    auto-assigned port is drawn again; only a configured port that is busy is an error.
    """

    for _ in range(attempts):
        port = probe(host)
        if port not in taken and not _port_busy(host, port):
            return port
    raise StackError(f"no free port on {host} after {attempts} draws")


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class LocalStack:
    """The services of one :class:`StackSettings` as local processes.

    >>> with LocalStack(StackSettings(services=["mcp-server"])) as stack:
    ...     stack.urls["mcp-server"]
    """

    def __init__(self, config: StackSettings | None = None) -> None:
        self.config = config or StackSettings.from_env()
        self.runs_dir = self.config.runs_dir.resolve()
        self.log_dir = self.runs_dir / "logs"
        self.data_dir = self.runs_dir / "data"
        self.ports: dict[str, int] = {}
        self.urls: dict[str, str] = {}
        self.served_model: str | None = None
        self.processes: dict[str, ServiceProcess] = {}
        self._order = start_order(self.config.services)

    # -- addresses -----------------------------------------------------------------------

    def _assign_ports(self) -> None:
        host = self.config.host
        for level in self._order:
            for name in level:
                port = self.config.port_of(name) or pick_free_port(host, set(self.ports.values()))
                if _port_busy(host, port):
                    spec = SERVICES[name]
                    raise StackError(
                        f"{name}: port {port} on {host} is in use (another stack or service?). "
                        f"Set {spec.port_env} or STACK_PORTS to use another one."
                    )
                self.ports[name] = port
                self.urls[name] = f"http://{host}:{port}"

    @property
    def mcp_url(self) -> str | None:
        """The MCP server the pipeline uses (external, or the chosen local one)."""

        if self.config.mcp_url:
            return self.config.mcp_url
        name = self.config.mcp
        if name in self.urls:
            return f"{self.urls[name]}/mcp"
        local = [n for n in MCP_SERVERS if n in self.urls]
        return f"{self.urls[local[0]]}/mcp" if local else None

    def client_env(self) -> dict[str, str]:
        """Variables a client of the stack needs (demo, tests, a trainer run by hand)."""

        env: dict[str, str] = {}
        if self.mcp_url:
            env["MCP_URL"] = self.mcp_url
        if "inference" in self.urls:
            env["POLICY_BASE_URL"] = f"{self.urls['inference']}/v1"
            if self.served_model:
                env["POLICY_MODEL"] = self.served_model
        if "judge" in self.urls:
            env["JUDGE_URL"] = self.urls["judge"]
        if "scenario-gen" in self.urls:
            env["SCENARIO_GEN_URL"] = self.urls["scenario-gen"]
        return env

    def env_for(self, name: str) -> dict[str, str]:
        """The environment of one service: stack defaults < caller's env < config.env,
        with host and port always the stack's."""

        spec = SERVICES[name]
        defaults = service_env(name, self.config, self.urls, self.data_dir, self.served_model)
        if self.config.inherit_env:
            defaults = {k: v for k, v in defaults.items() if k not in os.environ}
        env = {**defaults, **self.config.env}
        env[spec.host_env] = self.config.host
        env[spec.port_env] = str(self.ports[name])
        if name == "trainer":  # the trainer's status server reads these two names
            env["TRAINER_HOST"], env["TRAINER_PORT"] = self.config.host, str(self.ports[name])
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        return env

    def _argv(self, name: str) -> list[str]:
        spec = SERVICES[name]
        argv = [*script_command(spec.script), *spec.args]
        if name == "trainer":
            assert self.config.train_config is not None
            argv += ["--config", str(self.config.train_config.resolve())]
        return argv

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> LocalStack:
        """Start every level in order; on any failure stop what was started and raise."""

        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._assign_ports()
            for level in self._order:
                self._start_level(level)
                if "inference" in level:
                    self.served_model = self._served_model()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_level(self, level: list[str]) -> None:
        procs = []
        for name in level:
            spec = SERVICES[name]
            log_path = self.log_dir / f"{name}.log"
            with log_path.open("a") as fh:
                fh.write(f"\n=== {time.strftime('%Y-%m-%dT%H:%M:%S')} mcprl-stack starts "
                         f"{name} on {self.urls[name]}\n")
            proc = ServiceProcess(name, self._argv(name), env=self.env_for(name),
                                  health_url=None if spec.job
                                  else self.urls[name] + spec.health_path,
                                  log_path=log_path, cwd=Path.cwd())
            self.processes[name] = proc
            procs.append(proc)
        timeout = self.config.health_timeout_s
        # Not a `with` block: on Ctrl-C we must not wait for the health polls to time out;
        # stop() kills the processes, which ends the polls at once.
        pool = ThreadPoolExecutor(max_workers=len(procs), thread_name_prefix="stack-start")
        try:
            futures = {p.name: pool.submit(p.start, timeout) for p in procs}
            errors = []
            for name, fut in futures.items():
                exc = fut.exception()
                if exc is not None:
                    log_path = self.log_dir / f"{name}.log"
                    errors.append(f"{name} failed to start ({exc}); end of {log_path}:\n"
                                  f"{log_tail(log_path)}")
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        if errors:
            raise StackError("\n\n".join(errors))
        for name in level:
            log.info("service up", extra={"service": name, "url": self.urls[name]})

    def _served_model(self) -> str | None:
        """The model id the engine serves (what clients must send as ``model``)."""

        try:
            resp = httpx.get(self.urls["inference"] + "/v1/models", timeout=10)
            resp.raise_for_status()
            return str(resp.json()["data"][0]["id"])
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            raise StackError(f"inference is up but /v1/models is unusable: {exc}") from exc

    def stop(self) -> dict[str, int | None]:
        """Stop every service in reverse start order; returns their exit codes."""

        codes: dict[str, int | None] = {}
        for name in reversed(list(self.processes)):
            proc = self.processes[name]
            try:
                codes[name] = proc.stop(self.config.stop_timeout_s)
            except Exception as exc:  # keep stopping the others
                log.warning("stopping %s failed: %s", name, exc)
                codes[name] = None
        self.processes.clear()
        return codes

    def kill(self, name: str) -> int | None:
        """SIGKILL one service's process group at once (fault tests: a crash, no drain)."""

        proc = self.processes[name]
        if proc.proc is None or proc.proc.poll() is not None:
            return proc.proc.returncode if proc.proc else None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.proc.pid, signal.SIGKILL)
        code = proc.proc.wait(30)
        proc.stop()  # closes its log file
        return code

    def restart(self, name: str) -> None:
        """Start one (stopped or killed) service again on its port; waits until healthy."""

        old = self.processes.get(name)
        if old is not None and old.alive:
            old.stop(self.config.stop_timeout_s)
        self._start_level([name])

    def exited(self) -> dict[str, int]:
        """Services whose process has ended, with the exit code."""

        out: dict[str, int] = {}
        for name, proc in self.processes.items():
            if proc.proc is not None and proc.proc.poll() is not None:
                out[name] = proc.proc.returncode
        return out

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
