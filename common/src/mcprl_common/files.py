"""File modes of the model folders we write: readable by every user.

``safetensors`` and ``tempfile`` create files with mode 0600, and the service images run as
an unprivileged user (uid 10001) that must read models built by another user.
"""

from __future__ import annotations

import os
from pathlib import Path


def make_readable(root: Path) -> None:
    """Files 0644 and folders 0755 under ``root`` (``root`` included)."""

    os.chmod(root, 0o755)
    for path in root.rglob("*"):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
