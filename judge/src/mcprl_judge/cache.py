"""Content-hash cache of judgements in SQLite, so the same group is never paid for twice.

The key hashes what determines the judge model's answer: the model and the exact prompt
(which holds the rubric, the task, the tools and the serialised group). The reward mode and
weights are left out on purpose: they combine the cached judgement afterwards, so changing
them re-uses the judgement instead of paying for it again.

sqlite3 is blocking, so calls run in worker threads, each with its own connection; WAL mode
and a busy timeout make concurrent readers and writers (several workers, several processes)
safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from mcprl_judge.judge_output import JudgeAnswer

CACHE_FORMAT = "ruler-v1"  # bump when the prompt or the stored shape changes

_SCHEMA = """
CREATE TABLE IF NOT EXISTS judgements (
    key TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    created_at REAL NOT NULL,
    answer TEXT NOT NULL
)
"""


def cache_key(model: str, messages: list[dict[str, Any]]) -> str:
    payload = json.dumps({"format": CACHE_FORMAT, "model": model, "messages": messages},
                         sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


class JudgementCache:
    """``get``/``put`` of :class:`JudgeAnswer` by key; safe from many threads and tasks."""

    def __init__(self, path: Path, ttl_s: float = 0.0) -> None:
        self.path = Path(path)
        self.ttl_s = ttl_s
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._connect().execute(_SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=10.0, isolation_level=None,
                                   check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
            with self._lock:
                self._connections.append(conn)
        return conn

    def _get(self, key: str) -> JudgeAnswer | None:
        row = self._connect().execute(
            "SELECT created_at, answer FROM judgements WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        if self.ttl_s and time.time() - row[0] > self.ttl_s:
            return None
        return JudgeAnswer.model_validate_json(row[1])

    def _put(self, key: str, model: str, answer: JudgeAnswer) -> None:
        self._connect().execute(
            "INSERT OR REPLACE INTO judgements (key, model, created_at, answer) "
            "VALUES (?, ?, ?, ?)", (key, model, time.time(), answer.model_dump_json()))

    async def get(self, key: str) -> JudgeAnswer | None:
        return await asyncio.to_thread(self._get, key)

    async def put(self, key: str, model: str, answer: JudgeAnswer) -> None:
        await asyncio.to_thread(self._put, key, model, answer)

    def count(self) -> int:
        return int(self._connect().execute("SELECT COUNT(*) FROM judgements").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            for conn in self._connections:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            self._connections.clear()
        self._local = threading.local()
