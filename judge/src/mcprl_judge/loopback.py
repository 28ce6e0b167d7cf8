"""A real judge on loopback, in a background thread: for tests of the judge and its clients,
and for tools that need one for a while (the ART parity check)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mcprl_common.process import UvicornThread
from mcprl_judge.app import create_app
from mcprl_judge.settings import JudgeSettings


@contextlib.contextmanager
def serve_judge(settings: JudgeSettings | None = None, *, port: int | None = None,
                cache_dir: Path | None = None, **overrides: Any) -> Iterator[str]:
    """A judge on 127.0.0.1 in a background thread; yields its base URL."""

    if settings is None:
        if cache_dir is not None:
            overrides.setdefault("cache_path", cache_dir / "judge-cache.sqlite3")
        settings = JudgeSettings(**overrides)
    with UvicornThread(create_app(settings), port=port) as server:
        yield server.url
