"""ServiceProcess.stop: whatever happens while it waits, the child does not outlive it."""

from __future__ import annotations

import _thread
import signal
import subprocess
import sys
import threading
import time

import pytest

from mcprl_common.process import ServiceProcess

# A child that ignores SIGTERM (as a service busy with long work may answer it late).
STUBBORN = ("import signal, time\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('ready', flush=True)\n"
            "time.sleep(600)\n")


def _stubborn(tmp_path) -> ServiceProcess:
    proc = ServiceProcess("stubborn", [sys.executable, "-c", STUBBORN],
                          log_path=tmp_path / "stubborn.log").start()
    deadline = time.monotonic() + 30
    while "ready" not in (tmp_path / "stubborn.log").read_text():
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.05)
    return proc


def test_a_child_that_ignores_sigterm_is_killed_after_the_timeout(tmp_path) -> None:
    proc = _stubborn(tmp_path)
    started = time.monotonic()
    code = proc.stop(timeout_s=0.5)
    assert code is not None and code < 0 and not proc.alive
    assert time.monotonic() - started < 10


def test_an_interrupt_while_waiting_kills_the_child_and_goes_on(tmp_path) -> None:
    """A second Ctrl-C during the SIGTERM grace period (how `make demo` was once left with
    an orphaned trainer): the child is killed at once and the interrupt still propagates."""

    proc = _stubborn(tmp_path)
    # Ctrl-C's own handler, whatever an earlier test of the session left installed.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            proc.stop(timeout_s=60)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, previous)
    assert not proc.alive and proc.proc is not None and proc.proc.returncode < 0
    assert time.monotonic() - started < 15


def test_open_files_limit_is_raised_to_the_hard_limit() -> None:
    """In a child started with a soft limit of 256 (hard 4,096), the call lifts it to 4,096."""

    import resource

    def low() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 4096))

    code = ("import resource; from mcprl_common.process import raise_open_files_limit; "
            "before = resource.getrlimit(resource.RLIMIT_NOFILE); "
            "print(before, raise_open_files_limit())")
    out = subprocess.run([sys.executable, "-c", code], preexec_fn=low, capture_output=True,
                         text=True, timeout=30, check=True).stdout.strip()
    assert out == "(256, 4096) (4096, 4096)"
