"""Model folders that containers mount are readable by every user.

safetensors writes ``model.safetensors`` with mode 0600; the images run as uid 10001, so the
CPU inference container could not read a model made by `make tiny-model` ("No such file or
directory"). Every model writer calls ``mcprl_common.files.make_readable``; these tests build a
tiny model and check the folders `make tiny-model` and `make base-model` leave under models/.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from mcprl_common.files import make_readable
from mcprl_inference import tiny_model

pytestmark = pytest.mark.timeout(120)
REPO = Path(__file__).resolve().parents[2]


def unreadable(root: Path) -> list[str]:
    """Files under ``root`` that other users cannot read (folders they cannot enter)."""

    bad = []
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        need = stat.S_IROTH | (stat.S_IXOTH if path.is_dir() else 0)
        if mode & need != need:
            bad.append(f"{path.relative_to(root)} {stat.filemode(mode)}")
    return bad


def test_make_readable_opens_files_and_folders_to_reading_only(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir(mode=0o700)
    secret = tmp_path / "sub" / "weights.bin"
    secret.write_bytes(b"x")
    os.chmod(secret, 0o600)
    assert unreadable(tmp_path)  # control: the check sees a 0600 file
    make_readable(tmp_path)
    assert unreadable(tmp_path) == []
    assert stat.S_IMODE(secret.stat().st_mode) == 0o644  # readable, not writable/executable
    assert stat.S_IMODE((tmp_path / "sub").stat().st_mode) == 0o755


def test_tiny_model_files_are_readable_by_every_user(tmp_path: Path) -> None:
    out = tiny_model.build("tiny-test", tmp_path)
    assert (out / "model.safetensors").is_file()
    assert unreadable(out) == []
    os.chmod(out / "model.safetensors", 0o600)  # a folder written before the fix
    tiny_model.build("tiny-test", tmp_path)  # up to date: not rebuilt, but repaired
    assert unreadable(out) == []


@pytest.mark.parametrize("name", ["tiny-test", "tiny-learn", "smollm2-135m-instruct"])
def test_models_folder_is_readable_by_every_user(name: str) -> None:
    """What `make tiny-model` / `make base-model` left in this checkout."""

    folder = REPO / "models" / name
    if not folder.is_dir():
        pytest.skip(f"models/{name} is not built in this checkout")
    assert unreadable(folder) == []
