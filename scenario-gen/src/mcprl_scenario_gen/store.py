"""Scenario sets on disk: ``<data_dir>/<set_id>/{train,val}.jsonl`` and ``manifest.json``.

Every file is written to a temporary name in the same directory, flushed, fsynced and moved
into place with ``os.replace``, so a reader (or a crash) never sees half a file. The
manifest is written last and is the commit marker: a set whose manifest says ``succeeded``
has complete split files. A generation that dies mid-way leaves ``candidates.jsonl`` (its
checkpoint) and a manifest still saying ``running``; :meth:`ScenarioStore.recover` turns
those into failed sets that keep what was made.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from mcprl_common.errors import BadRequestError, NotFoundError
from mcprl_common.files import atomic_write_bytes as _atomic_write_bytes
from mcprl_common.wire import Scenario, ScenarioSetManifest
from mcprl_scenario_gen.errors import StorageError

FORMAT_VERSION = 1
SPLITS = ("train", "val")
_SET_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,79}$")
SplitName = Literal["train", "val"]


class StoredManifest(ScenarioSetManifest):
    """The common manifest plus what this service adds (readers of the base model ignore it)."""

    format_version: int = Field(FORMAT_VERSION, description="Layout version of the set.")
    warnings: list[str] = Field(default_factory=list, description="Shortfalls, drops.")
    progress: dict[str, Any] = Field(default_factory=dict, description="Last progress seen.")
    usage: dict[str, int] = Field(default_factory=dict, description="LLM calls and tokens.")
    files: dict[str, str] = Field(default_factory=dict, description="Split -> file name.")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """:func:`mcprl_common.files.atomic_write_bytes`, with a failing volume reported as a
    :class:`StorageError` (507) naming the file and the reason."""

    try:
        _atomic_write_bytes(path, data)
    except OSError as exc:
        raise StorageError(f"cannot write {path}: {exc.strerror or exc} (scenario-gen's data "
                           "directory must be writable and have room)") from exc


def jsonl_bytes(scenarios: Iterable[Scenario]) -> bytes:
    return b"".join(s.model_dump_json(exclude_none=False).encode() + b"\n" for s in scenarios)


def read_jsonl(path: Path) -> list[Scenario]:
    out: list[Scenario] = []
    with path.open("rb") as fh:
        for line in fh:
            if line.strip():
                out.append(Scenario.model_validate_json(line))
    return out


class ScenarioStore:
    """Reads and writes scenario sets under one data directory."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def new_set_id(self) -> str:
        return f"ss-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"

    def set_dir(self, set_id: str) -> Path:
        if not _SET_ID.match(set_id):
            raise BadRequestError(f"invalid scenario set id {set_id!r}", param="id")
        return self.root / set_id

    def exists(self, set_id: str) -> bool:
        return (self.set_dir(set_id) / "manifest.json").is_file()

    def save_manifest(self, manifest: StoredManifest) -> None:
        body = manifest.model_dump_json(indent=2).encode() + b"\n"
        atomic_write_bytes(self.set_dir(manifest.id) / "manifest.json", body)

    def load_manifest(self, set_id: str) -> StoredManifest:
        path = self.set_dir(set_id) / "manifest.json"
        if not path.is_file():
            raise NotFoundError(f"scenario set {set_id!r} not found", param="id")
        return StoredManifest.model_validate_json(path.read_bytes())

    def save_split(self, set_id: str, split: SplitName, scenarios: list[Scenario]) -> None:
        atomic_write_bytes(self.set_dir(set_id) / f"{split}.jsonl", jsonl_bytes(scenarios))

    def load_split(self, set_id: str, split: SplitName) -> list[Scenario]:
        if split not in SPLITS:
            raise BadRequestError(f"split must be one of {', '.join(SPLITS)}", param="split")
        self.load_manifest(set_id)
        path = self.set_dir(set_id) / f"{split}.jsonl"
        return read_jsonl(path) if path.is_file() else []

    def save_checkpoint(self, set_id: str, candidates: list[Scenario]) -> None:
        atomic_write_bytes(self.set_dir(set_id) / "candidates.jsonl", jsonl_bytes(candidates))

    def load_checkpoint(self, set_id: str) -> list[Scenario]:
        path = self.set_dir(set_id) / "candidates.jsonl"
        return read_jsonl(path) if path.is_file() else []

    def drop_checkpoint(self, set_id: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.set_dir(set_id) / "candidates.jsonl").unlink()

    def write_set(self, manifest: StoredManifest, train: list[Scenario],
                  val: list[Scenario]) -> None:
        """Both splits, then the manifest (the commit marker)."""

        self.save_split(manifest.id, "train", train)
        self.save_split(manifest.id, "val", val)
        manifest.files = {"train": "train.jsonl", "val": "val.jsonl"}
        self.save_manifest(manifest)

    def list_sets(self) -> list[StoredManifest]:
        if not self.root.is_dir():
            return []
        out = []
        for child in sorted(self.root.iterdir()):
            if (child / "manifest.json").is_file() and _SET_ID.match(child.name):
                try:
                    out.append(self.load_manifest(child.name))
                except ValueError:
                    continue
        return sorted(out, key=lambda m: m.created_at, reverse=True)

    def delete(self, set_id: str) -> None:
        path = self.set_dir(set_id)
        if not path.is_dir():
            raise NotFoundError(f"scenario set {set_id!r} not found", param="id")
        # Rename first so a half-deleted set is never mistaken for a real one.
        trash = self.root / f".deleting-{set_id}-{secrets.token_hex(3)}"
        try:
            os.replace(path, trash)
        except OSError as exc:
            raise StorageError(f"cannot delete {path}: {exc.strerror or exc}") from exc
        shutil.rmtree(trash, ignore_errors=True)

    def cleanup_tmp(self) -> int:
        """Remove temporary files a crash left behind; returns how many."""

        removed = 0
        if not self.root.is_dir():
            return 0
        for tmp in self.root.glob("*/.*.tmp"):
            with contextlib.suppress(OSError):
                tmp.unlink()
                removed += 1
        for trash in self.root.glob(".deleting-*"):
            shutil.rmtree(trash, ignore_errors=True)
        return removed

    def interrupted(self) -> list[StoredManifest]:
        return [m for m in self.list_sets() if m.status in ("pending", "running")]


def dumps_art(scenarios: Iterable[Scenario]) -> str:
    """ART's scenario list: a JSON array of ``{"task", "difficulty"}``."""

    return json.dumps([s.to_art() for s in scenarios], indent=2, ensure_ascii=False) + "\n"
