"""Files we write: readable by every user, and never seen half-written.

``safetensors`` and ``tempfile`` create files with mode 0600, and the service images run as
an unprivileged user (uid 10001) that must read models built by another user (and people
read what a containerised trainer wrote).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def make_readable(root: Path) -> None:
    """Files 0644 and folders 0755 under ``root`` (``root`` included)."""

    os.chmod(root, 0o755)
    for path in root.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file beside ``path``, fsync it, rename it over ``path`` (0644)."""

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fh.fileno(), 0o644)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
