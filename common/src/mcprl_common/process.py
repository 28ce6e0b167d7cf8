"""Run services on loopback: in a thread (tests) or as child processes (tests, demo,
``make stack``), waiting for health and always tearing down."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import uvicorn


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def raise_open_files_limit() -> tuple[int, int]:
    """Lift this process's soft limit on open files to its hard limit; returns (soft, hard).

    Hundreds of concurrent rollouts each hold an MCP session (a POST and a stream socket)
    and an engine connection, which passes the common soft default of 1,024 descriptors;
    a socket that cannot be opened then shows up as a dropped MCP session. vLLM's server
    raises its limit at start for the same reason.
    """

    try:
        import resource
    except ImportError:  # not on this platform
        return -1, -1
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def sigterm_as_interrupt() -> None:
    """Make SIGTERM behave like Ctrl-C in this (main-thread) CLI.

    The default SIGTERM action ends the process at once, so ``finally`` blocks and exit
    stacks never run and the services a CLI started (each in its own session) outlive it.
    """

    signal.signal(signal.SIGTERM, _interrupt)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_healthy(url: str, timeout_s: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Poll ``url`` until it answers 200; fail fast if ``proc`` exits meanwhile."""

    deadline = time.monotonic() + timeout_s
    delay = 0.02
    last = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode} before {url} was healthy")
        try:
            resp = httpx.get(url, timeout=2.0)
            if resp.status_code == 200:
                return
            last = f"HTTP {resp.status_code}"
        except httpx.HTTPError as exc:
            last = type(exc).__name__
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
    raise TimeoutError(f"{url} not healthy after {timeout_s:.0f}s ({last})")


# Idle client connections stay open this long (uvicorn's default is 5 s). A client that
# reuses a pooled connection as the server closes it gets "Server disconnected" on a request
# the server never read; httpx and the openai SDK keep idle connections for 5 s, and
# Prometheus scrapes the trainer every 5 s, so servers keep them longer (75 s, the usual
# advice for servers behind a load balancer that keeps them 60 s). docs/reliability.md.
KEEP_ALIVE_S = 75


class UvicornThread:
    """An ASGI app served by uvicorn on a background thread, for in-process tests."""

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int | None = None, *,
                 keep_alive_s: float = KEEP_ALIVE_S) -> None:
        self.host = host
        self.port = port or free_port(host)
        config = uvicorn.Config(app, host=host, port=self.port, log_config=None,
                                access_log=False, lifespan="on", timeout_graceful_shutdown=5,
                                timeout_keep_alive=keep_alive_s)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name=f"uvicorn:{self.port}",
                                       daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 60.0) -> UvicornThread:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("uvicorn thread died during startup")
            if time.monotonic() > deadline:
                raise TimeoutError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)

    def __enter__(self) -> UvicornThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServiceProcess:
    """A service as a child process in its own process group, logged to a file."""

    def __init__(self, name: str, argv: Sequence[str], *, env: dict[str, str] | None = None,
                 health_url: str | None = None, log_path: Path | None = None,
                 cwd: Path | None = None) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = {**os.environ, **(env or {})}
        self.health_url = health_url
        self.log_path = log_path
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self._log_file: Any = None

    def start(self, timeout_s: float = 120.0) -> ServiceProcess:
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        out = self._log_file or subprocess.DEVNULL
        self.proc = subprocess.Popen(self.argv, env=self.env, cwd=self.cwd, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        if self.health_url:
            try:
                wait_healthy(self.health_url, timeout_s, self.proc)
            except Exception:
                self.stop()
                raise
        return self

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM the process group, SIGKILL what is left after ``timeout_s``."""

        if self.proc is None:
            return None
        try:
            if self.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout_s)
                except (subprocess.TimeoutExpired, KeyboardInterrupt) as exc:
                    # A second Ctrl-C (or SIGTERM) while waiting must not leave the child
                    # running: it is killed, then the interrupt goes on.
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(5)
                    if isinstance(exc, KeyboardInterrupt):
                        raise
        finally:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None
        return self.proc.returncode

    def __enter__(self) -> ServiceProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def running(*services: ServiceProcess | UvicornThread) -> Iterator[None]:
    """Start services in order and stop them in reverse, whatever happens in between."""

    started: list[ServiceProcess | UvicornThread] = []
    try:
        for svc in services:
            svc.start()
            started.append(svc)
        yield
    finally:
        for svc in reversed(started):
            svc.stop()
