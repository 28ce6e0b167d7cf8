"""The engine pool: least open requests first, a failed replica left out with a doubling
backoff and taken back after it, and the one due back first tried when all are out."""

from __future__ import annotations

import pytest

from mcprl_trainer.engines import EnginePool

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_pick_backoff_and_return() -> None:
    clock = Clock()
    pool = EnginePool.from_urls(["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"],
                                backoff_s=1.0, backoff_max_s=3.0, clock=clock)
    a, b = pool.replicas
    try:
        assert pool.pick() is a
        a.open_requests = 2
        assert pool.pick() is b  # fewer open requests
        b.open_requests = 2
        b.groups = 1
        assert pool.pick() is a  # tie on requests: fewer groups
        pool.mark_down(a, ConnectionError("refused"))
        assert not pool.is_up(a) and pool.pick() is b and a.adapter is None
        clock.now += 1.01
        assert pool.is_up(a)  # back after 1 s
        pool.mark_down(a, ConnectionError("refused"))
        clock.now += 1.5
        assert not pool.is_up(a)  # 2 s the second time in a row
        pool.mark_down(b, ConnectionError("refused"))
        assert pool.up() == [] and pool.pick() is a  # a is due back first (0.5 s left vs 1)
        for _ in range(4):
            pool.mark_down(a, ConnectionError("refused"))
        assert a.down_until == pytest.approx(clock.now + 3.0)  # capped
        pool.mark_ok(a)
        assert pool.is_up(a) and a.failures == 0
    finally:
        await pool.aclose()
