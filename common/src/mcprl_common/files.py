"""File helpers for what one process writes and another reads, often as another user.

Model writers (``save_pretrained``, safetensors) create some files with mode 0600; a container
that mounts the folder and runs as another uid then cannot read them and reports "No such
file or directory". Every writer of a model folder calls :func:`make_readable` when done.
"""

from __future__ import annotations

import os
import stat
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
