"""File helpers for what one process writes and another reads, often as another user.

Model writers (``save_pretrained``, safetensors) create some files with mode 0600; a container
that mounts the folder and runs as another uid then cannot read them and reports "No such
file or directory". Every writer of a model folder calls :func:`make_readable` when done.
Files are written so that a crash, a full disk or a read-only volume never leaves half a file
where a reader looks: a temporary file in the same directory, flushed, fsynced, renamed.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


def make_readable(root: Path) -> None:
    """Give everyone read access to every file under ``root`` (and search access to every
    folder), as a 022 umask would have; nothing is made writable or executable."""

    root = Path(root)
    paths = [root, *root.rglob("*")] if root.is_dir() else [root]
    for path in paths:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        extra = stat.S_IRGRP | stat.S_IROTH
        if path.is_dir():
            extra |= stat.S_IXGRP | stat.S_IXOTH
        if mode & extra != extra:
            os.chmod(path, stat.S_IMODE(mode) | extra)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` (mode 0644) atomically; on any failure ``path`` is left
    as it was and the temporary file is removed (the OSError propagates: ENOSPC, EROFS ...)."""

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
