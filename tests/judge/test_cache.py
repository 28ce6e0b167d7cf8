"""The SQLite judgement cache: hits by content, TTL, and safety under concurrency."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from mcprl_judge.cache import JudgementCache, cache_key
from mcprl_judge.judge_output import JudgeAnswer, Judgement

MSGS = [{"role": "user", "content": "judge these"}]


def answer(score: float) -> JudgeAnswer:
    return JudgeAnswer(judgements=[Judgement(explanation="x", score=score)])


def test_key_depends_on_model_and_prompt() -> None:
    assert cache_key("m", MSGS) == cache_key("m", [dict(MSGS[0])])
    assert cache_key("m", MSGS) != cache_key("n", MSGS)
    assert cache_key("m", MSGS) != cache_key("m", [{"role": "user", "content": "judge those"}])


async def test_get_put_and_persistence(tmp_path: Path) -> None:
    path = tmp_path / "c" / "cache.sqlite3"
    cache = JudgementCache(path)
    assert await cache.get("k") is None
    await cache.put("k", "m", answer(0.7))
    assert (await cache.get("k")).judgements[0].score == 0.7
    cache.close()
    reopened = JudgementCache(path)
    assert (await reopened.get("k")).judgements[0].score == 0.7
    reopened.close()


async def test_ttl_expires_entries(tmp_path: Path) -> None:
    cache = JudgementCache(tmp_path / "c.sqlite3", ttl_s=0.2)
    await cache.put("k", "m", answer(0.1))
    assert await cache.get("k") is not None
    await asyncio.sleep(0.3)
    assert await cache.get("k") is None
    cache.close()


def test_many_threads_and_two_instances_write_safely(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite3"
    a, b = JudgementCache(path), JudgementCache(path)

    def work(i: int) -> None:
        cache = a if i % 2 else b
        asyncio.run(cache.put(f"k{i}", "m", answer(i / 100)))
        assert asyncio.run(cache.get(f"k{i}")).judgements[0].score == i / 100

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(64)))
    assert a.count() == 64
    a.close()
    b.close()
