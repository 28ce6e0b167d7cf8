"""Several engine replicas behind one sampler: which replica a group goes to, and which are up.

A group's G rollouts share their prompt (system prompt, tools, task), so they go to one
replica, where its prefix cache serves the shared start once. Groups go to the replica with
the fewest open requests (ties: fewest groups bound, then the first). A replica that fails
(no answer, 5xx) is left out for a backoff that doubles with each failure in a row; then it
is tried again. When every replica is left out, the one due back first is tried (a single
engine behaves as before: each retry reaches it).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from mcprl_trainer.policy import PolicyClient

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Replica:
    """One engine and what the trainer knows of it."""

    index: int
    url: str
    client: PolicyClient
    open_requests: int = 0
    groups: int = 0  # groups bound to it now
    requests: int = 0  # requests sent, over the run
    failures: int = 0  # failures in a row
    down_until: float = 0.0  # left out until then (monotonic clock)
    adapter: Path | None = None  # the checkpoint whose adapter it serves; None = unknown
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def name(self) -> str:
        return f"{self.index}:{self.url}"


class EnginePool:
    """The replicas, their load and their health."""

    def __init__(self, clients: list[PolicyClient], *, backoff_s: float = 1.0,
                 backoff_max_s: float = 30.0, clock: Callable[[], float] = time.monotonic,
                 on_change: Callable[[Replica], None] | None = None) -> None:
        if not clients:
            raise ValueError("at least one engine is needed")
        self.replicas = [Replica(i, c.base_url, c) for i, c in enumerate(clients)]
        self.backoff_s = backoff_s
        self.backoff_max_s = backoff_max_s
        self.clock = clock
        self.on_change = on_change

    @classmethod
    def from_urls(cls, urls: list[str], *, api_key: str = "EMPTY", timeout_s: float = 300.0,
                  max_retries: int = 3, **kwargs) -> EnginePool:
        return cls([PolicyClient(u, api_key=api_key, timeout_s=timeout_s,
                                 max_retries=max_retries) for u in urls], **kwargs)

    @property
    def first(self) -> PolicyClient:
        return self.replicas[0].client

    def is_up(self, replica: Replica) -> bool:
        return replica.down_until <= self.clock()

    def up(self) -> list[Replica]:
        return [r for r in self.replicas if self.is_up(r)]

    def pick(self) -> Replica:
        """The least-loaded replica that is up (or, none being up, the one due back first)."""

        candidates = self.up()
        if not candidates:
            return min(self.replicas, key=lambda r: (r.down_until, r.index))
        return min(candidates, key=lambda r: (r.open_requests, r.groups, r.index))

    def mark_down(self, replica: Replica, exc: BaseException) -> None:
        """Leave ``replica`` out for a while; it may come back without its adapter."""

        replica.failures += 1
        wait = min(self.backoff_s * 2 ** (replica.failures - 1), self.backoff_max_s)
        replica.down_until = self.clock() + wait
        replica.adapter = None
        log.warning("engine replica left out", extra={
            "replica": replica.url, "failures": replica.failures, "retry_in_s": round(wait, 2),
            "reason": f"{type(exc).__name__}: {exc}"[:300]})
        self._changed(replica)

    def mark_ok(self, replica: Replica) -> None:
        if replica.failures or replica.down_until:
            log.info("engine replica back", extra={"replica": replica.url})
            replica.failures, replica.down_until = 0, 0.0
            self._changed(replica)

    def _changed(self, replica: Replica) -> None:
        if self.on_change is not None:
            self.on_change(replica)

    async def aclose(self) -> None:
        await asyncio.gather(*(r.client.aclose() for r in self.replicas))
