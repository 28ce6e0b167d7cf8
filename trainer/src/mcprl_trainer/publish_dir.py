"""Publishing adapters through a memory-backed folder where trainer and engines share a host.

Each step's adapter is what the engines load next. Written into ``checkpoints/step-N`` it
goes through the run volume's file system on the step's critical path; where an engine runs
on this host and sees the trainer's files (no ``policy.engine_output_dir``), the trainer
writes it to a tmpfs folder instead (``publish_dir: auto`` is ``/dev/shm``) and the engine
loads it from there. Off by default: on a local disk the page cache absorbs the write and
tmpfs measured no faster, on a 2-core VM and on an H100 host (bench/bench_publish.py); it
is for run volumes that are slow to write. The checkpoint writer copies those same files
into ``step-N`` in its background thread, so the checkpoint ``--resume`` reads is the same
as before.

Why a folder and not the bytes in the request: vLLM loads adapters only from a path, and
serialising to bytes and parsing them again cost more than a tmpfs file's write and read
(bench/bench_publish.py, docs/benchmarks.md "Publishing an adapter").

Memory stays bounded: a run's folder holds only what an engine may still be loading, the
current version and the one before (the background copy of the current one reads it too),
and is removed when the run ends; folders of runs whose process is gone are removed when a
run starts. A full or unwritable folder publishes that step from the checkpoint instead.

Which replicas use it is :class:`~mcprl_trainer.publish.AdapterPublisher`'s call: one whose
URL is not on this host loads from the checkpoint; one that answers 404 for the folder's path
(another mount namespace) is given the checkpoint's path once it is on disk, with a warning,
and from then on.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import shutil
import socket
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

from mcprl_trainer.config import RunConfig

log = logging.getLogger(__name__)

AUTO = "auto"
OFF = "off"
DEFAULT_ROOT = Path("/dev/shm")
KEEP_VERSIONS = 2  # the current adapter and the one before (a replica may still load it)
PREFIX = "mcprl-publish-"


class AdapterSaving(Protocol):
    """A model whose peft adapter can be saved alone (an
    :class:`~mcprl_trainer.update_group.UpdateGroup`)."""

    def save_adapter(self, path: str) -> None: ...


@dataclass
class StagedAdapter:
    """One version's adapter in the publish folder, and the checkpoint it belongs to.

    ``on_disk`` is the checkpoint writer's job that copies it into ``checkpoint`` (set by
    :meth:`~mcprl_trainer.checkpoint_writer.CheckpointWriter.save`); a replica that cannot see
    the folder waits for it before loading the checkpoint's copy. None = already there."""

    version: int
    path: Path
    checkpoint: Path
    on_disk: Future[None] | None = None


def root_for(setting: str) -> Path | None:
    """The folder ``publish_dir`` names: ``auto`` is ``/dev/shm`` where it exists and is
    writable (None elsewhere), ``off`` is None, anything else that path."""

    if setting == OFF:
        return None
    if setting == AUTO:
        usable = DEFAULT_ROOT.is_dir() and os.access(DEFAULT_ROOT, os.W_OK | os.X_OK)
        return DEFAULT_ROOT if usable else None
    return Path(setting)


def is_local_url(url: str) -> bool:
    """Whether an engine URL is on this host (loopback, ``localhost`` or this host's name):
    only such an engine can read a file the trainer writes to its own tmpfs."""

    host = (urlsplit(url).hostname or "").lower()
    if host in ("localhost", socket.gethostname().lower(), socket.getfqdn().lower()):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def open_publish_dir(config: RunConfig, *, distributed: bool) -> PublishDir | None:
    """The run's publish folder, or None where adapters are published from the checkpoint:
    ``publish_dir: off``, an engine in another mount namespace (``policy.engine_output_dir``),
    no engine on this host, checkpoints written synchronously (the adapter is on disk before
    publishing anyway: a second write would only add time), several ranks (the same), or a
    folder that cannot be used."""

    root = root_for(config.publish_dir)
    why = None
    if root is None:
        why = "off" if config.publish_dir == OFF else f"{DEFAULT_ROOT} is not writable"
    elif config.policy.engine_output_dir:
        why = "policy.engine_output_dir is set (the engine sees other mounts)"
    elif not any(is_local_url(u) for u in config.policy.engine_urls):
        why = "no engine replica is on this host"
    elif not config.background_checkpoints:
        why = "background_checkpoints is off"
    elif distributed:
        why = "several trainer ranks save the checkpoint together"
    if why is None:
        assert root is not None
        try:
            return PublishDir(root, config.name)
        except OSError as exc:
            why = f"{root} cannot be used: {exc}"
    log.info("adapters published from the checkpoint folder", extra={
        "publish_dir": config.publish_dir, "reason": why})
    return None


class PublishDir:
    """One run's folder of published adapters: ``<root>/mcprl-publish-<run>-<pid>/v<N>``."""

    def __init__(self, root: Path, run_name: str) -> None:
        self.root = root
        self.folder = root / f"{PREFIX}{run_name}-{os.getpid()}"
        self._staged: dict[Path, StagedAdapter] = {}  # checkpoint path -> its adapter here
        remove_orphans(root)
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True)
        log.info("adapters published through %s", self.folder,
                 extra={"publish_dir": str(self.folder)})

    def stage(self, version: int, model: AdapterSaving, checkpoint: Path) -> StagedAdapter | None:
        """Write ``model``'s adapter as ``version`` (the step whose checkpoint is
        ``checkpoint``) and drop versions older than the one before; None when it cannot be
        written (the step is published from the checkpoint, which then saves it itself)."""

        final = self.folder / f"v{version}"
        tmp = self.folder / f".tmp-v{version}"
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            model.save_adapter(str(tmp))
            shutil.rmtree(final, ignore_errors=True)
            os.rename(tmp, final)  # an engine never sees a half-written version
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
            log.warning("cannot write the adapter to the publish dir (%s): this step is "
                        "published from the checkpoint", "full" if full else exc,
                        extra={"publish_dir": str(self.folder), "step": version})
            return None
        staged = StagedAdapter(version, final, checkpoint.resolve())
        self._staged[staged.checkpoint] = staged
        self._prune()
        return staged

    def lookup(self, checkpoint: Path) -> StagedAdapter | None:
        """The staged adapter of ``checkpoint``, if it is still in the folder."""

        return self._staged.get(checkpoint.resolve())

    def versions(self) -> list[int]:
        """The versions in the folder now, oldest first."""

        return sorted(s.version for s in self._staged.values())

    def _prune(self) -> None:
        keep = set(self.versions()[-KEEP_VERSIONS:])
        for key, staged in list(self._staged.items()):
            if staged.version not in keep:
                del self._staged[key]
                shutil.rmtree(staged.path, ignore_errors=True)

    def close(self) -> None:
        """Remove the run's folder (the run ended, or failed)."""

        self._staged.clear()
        shutil.rmtree(self.folder, ignore_errors=True)


def remove_orphans(root: Path) -> list[Path]:
    """Remove publish folders of this user's runs whose process is gone (a crash or SIGKILL
    skipped their cleanup); returns what was removed."""

    removed = []
    try:
        children = list(root.glob(f"{PREFIX}*"))
    except OSError:
        return removed
    for child in children:
        pid = child.name.rsplit("-", 1)[-1]
        try:
            if not pid.isdigit() or child.stat().st_uid != os.getuid() or _alive(int(pid)):
                continue
        except OSError:
            continue
        shutil.rmtree(child, ignore_errors=True)
        removed.append(child)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
