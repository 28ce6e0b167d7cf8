"""Helpers for tests of scenario-gen and of the services that use its sets (judge, trainer).

``wait_finished`` polls a scenario set over the real HTTP API until the job ends, so every
test that builds a set on loopback waits the same way and fails with the last status seen.
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from mcprl_scenario_gen.service import FINISHED


def wait_finished(client: httpx.Client, set_id: str, timeout_s: float = 60.0,
                  poll_s: float = 0.1) -> dict[str, Any]:
    """GET ``/v1/scenario-sets/{set_id}`` until its status is final; that status body.

    Raises ``AssertionError`` (with the last body) when the set is still running after
    ``timeout_s``.
    """

    deadline = time.monotonic() + timeout_s
    while True:
        body = client.get(f"/v1/scenario-sets/{set_id}").json()
        if body["status"] in FINISHED:
            return body
        if time.monotonic() >= deadline:
            raise AssertionError(f"scenario set {set_id} did not finish in {timeout_s} s: {body}")
        time.sleep(poll_s)
