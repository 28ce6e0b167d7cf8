"""Checkpoints off the critical path: the adapter now, the rest in the background.

Publishing needs only the adapter (peft: ``adapter_config.json`` + safetensors). With
``background`` on, :meth:`CheckpointWriter.save` writes it into a temporary directory that is
renamed to ``checkpoints/step-N`` at once (the engine can load it: no file there is ever
half-written or rewritten), takes a host copy of the rest (optimizer in ``dcp/``, scheduler,
RNG, ``state.json``'s text) and returns; one writer thread adds those files to ``step-N``,
``state.json`` last (fsynced, renamed into place). Until then ``step-N`` is no checkpoint:
``--resume`` and pruning ignore it, so a crash mid-write loses only that step, as before.

With a publish folder (:mod:`mcprl_trainer.publish_dir`) the adapter is already written
there when :meth:`CheckpointWriter.save` is called: the writer thread copies those files into
``step-N`` first, then writes the rest, and nothing of the checkpoint touches the run volume
on the critical path.

At most one write is in flight: the next save (or :meth:`CheckpointWriter.wait`) waits for
it and raises its :class:`~mcprl_trainer.checkpoint.CheckpointWriteError`. Re-saving a step
that is already complete (after its eval) writes a whole new directory and swaps it in, as
the synchronous save does, so the complete one stays until the new one is.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import torch

from mcprl_common.files import atomic_write_bytes
from mcprl_trainer.checkpoint import (
    STATE_FILE,
    TRAINER_STATE_FILE,
    Checkpoint,
    CheckpointWriteError,
    checkpoints_dir,
    os_error,
    replace_atomically,
    rng_state,
    save_checkpoint,
    state_payload,
    temp_dir,
    write_error,
    write_trainer_files,
)
from mcprl_trainer.publish_dir import StagedAdapter

log = logging.getLogger(__name__)


class StateSnapshot(Protocol):
    """What a checkpoint holds besides the adapter, copied to host memory at save time."""

    def write(self, path: Path) -> None: ...


class Snapshotting(Protocol):
    """A model that can be saved in two parts (:class:`~mcprl_trainer.update_group.UpdateGroup`)."""

    def save_pretrained(self, path: str) -> None: ...
    def save_adapter(self, path: str) -> None: ...
    def snapshot_state(self) -> StateSnapshot | None: ...


class HostBuffers:
    """Host copies of a state tree. CUDA tensors go to pinned buffers, copied without blocking
    and reused from one save to the next (the writer waits for a write before the next
    snapshot); :meth:`ready` waits for the copies."""

    def __init__(self) -> None:
        self._pinned: dict[str, torch.Tensor] = {}
        self._event: Any = None
        self._from_cuda = False

    def copy(self, tree: Any) -> Any:
        self._event, self._from_cuda = None, False
        out = self._copy(tree, "")
        if self._from_cuda:  # the copies are queued on the stream: the writer waits for them
            self._event = torch.cuda.Event()
            self._event.record()
        return out

    def ready(self) -> None:
        if self._event is not None:
            self._event.synchronize()

    def _copy(self, obj: Any, key: str) -> Any:
        if isinstance(obj, torch.Tensor):
            obj = obj.detach()
            if obj.device.type == "cpu":
                return obj.clone()
            buf = self._pinned.get(key)
            if buf is None or buf.shape != obj.shape or buf.dtype != obj.dtype:
                buf = self._pinned[key] = torch.empty(obj.shape, dtype=obj.dtype,
                                                      pin_memory=True)
            self._from_cuda = True
            return buf.copy_(obj, non_blocking=True)
        if isinstance(obj, dict):
            return {k: self._copy(v, f"{key}/{k}") for k, v in obj.items()}
        if isinstance(obj, list | tuple):
            return type(obj)(self._copy(v, f"{key}/{i}") for i, v in enumerate(obj))
        return copy.deepcopy(obj)


class CheckpointWriter:
    """Saves the run's checkpoints, in the background when ``background`` is on and the model
    can take a snapshot (one process; several ranks save synchronously)."""

    def __init__(self, run_dir: Path, *, background: bool,
                 on_written: Callable[[int, float], None] | None = None) -> None:
        self.run_dir = run_dir
        self.background = background
        self.on_written = on_written  # (step, seconds) from the writer thread
        self.wait_seconds = 0.0  # how long the last save waited for the write before it
        self.write_seconds: dict[int, float] = {}  # step -> its background write's seconds
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future[None] | None = None

    @property
    def in_flight(self) -> bool:
        return self._pending is not None and not self._pending.done()

    def save(self, step: int, model: Any, trainer_state: dict[str, Any],
             state: dict[str, Any], *, staged: StagedAdapter | None = None) -> Checkpoint:
        """Save step ``step``; in the background, its adapter is complete on return (publish
        it) and the checkpoint once :meth:`wait` returns. Raises the previous write's error.

        ``staged``: the step's adapter, already in the publish folder; in the background it
        is copied into ``step-N`` by the writer thread (``staged.on_disk`` is that job) instead
        of saved again now."""

        t0 = time.perf_counter()
        self.wait()
        self.wait_seconds = time.perf_counter() - t0
        split = self.background and hasattr(model, "save_adapter")
        snapshot = model.snapshot_state() if split else None
        if snapshot is None:
            return save_checkpoint(self.run_dir, step, model, trainer_state, state)
        payload = state_payload(step, state)
        full = copy.deepcopy({**trainer_state, "rng": rng_state()})
        root = checkpoints_dir(self.run_dir)
        final = root / f"step-{step}"
        tmp = temp_dir(root, step)
        try:
            root.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()
            complete = (final / STATE_FILE).exists()
            if staged is not None and not complete:  # the writer copies it into step-N
                job = partial(_from_staged, self.run_dir, step, staged.path, tmp, final,
                              snapshot, full, payload)
            elif complete:  # swapped when the new one is
                model.save_adapter(str(tmp))

                def write(path: Path) -> None:
                    snapshot.write(path)
                    write_trainer_files(path, full, payload)

                job = partial(replace_atomically, self.run_dir, step, tmp, write)
            else:
                model.save_adapter(str(tmp))
                adapter = _publish_dir(tmp, final)
                job = partial(_complete, self.run_dir, step, final, adapter, snapshot, full,
                              payload)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            cause = os_error(exc)
            if cause is not None and not isinstance(exc, CheckpointWriteError):
                raise write_error(self.run_dir, step, cause) from exc
            raise
        self._submit(step, job)
        if staged is not None:
            staged.on_disk = self._pending
        return Checkpoint(step, final)

    def _submit(self, step: int, job: Callable[[], Any]) -> None:
        def run() -> None:
            t0 = time.perf_counter()
            job()
            seconds = time.perf_counter() - t0
            self.write_seconds[step] = seconds
            if self.on_written is not None:
                self.on_written(step, seconds)

        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="checkpoint-writer",
                                                initializer=_lower_priority)
        self._pending = self._executor.submit(run)

    def wait(self) -> None:
        """Block until the write in flight is on disk; raise its error (once)."""

        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self, *, raise_error: bool = True) -> None:
        """Finish the write in flight (the run's last checkpoint is complete) and stop the
        thread; ``raise_error=False`` (the run fails anyway) logs a write error instead."""

        try:
            self.wait()
        except BaseException:  # dcp's CheckpointException is no Exception
            if raise_error:
                raise
            log.exception("the last checkpoint could not be written")
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None


def _lower_priority() -> None:
    """The writer yields the CPU to the step it runs beside (Linux: a niceness per thread)."""

    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)


def _publish_dir(tmp: Path, final: Path) -> set[str]:
    """Rename the adapter-only ``tmp`` to ``final`` (replacing an incomplete one, which no
    resume would use); returns the adapter's file names."""

    names = set(os.listdir(tmp))
    if final.exists():
        stale = final.with_name(f".old-{final.name}-{time.time_ns()}")
        os.rename(final, stale)
        shutil.rmtree(stale, ignore_errors=True)
    os.rename(tmp, final)
    return names


def _from_staged(run_dir: Path, step: int, staged: Path, tmp: Path, final: Path,
                 snapshot: StateSnapshot, trainer_state: dict[str, Any], payload: str) -> None:
    """The writer thread's part when the adapter was published from the publish folder: its
    files copied into ``tmp``, renamed to ``step-N``, then the rest as :func:`_complete`."""

    try:
        for source in staged.iterdir():
            shutil.copyfile(source, tmp / source.name)
        adapter = _publish_dir(tmp, final)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        cause = os_error(exc)
        if cause is not None and not isinstance(exc, CheckpointWriteError):
            raise write_error(run_dir, step, cause) from exc
        raise
    _complete(run_dir, step, final, adapter, snapshot, trainer_state, payload)


def _complete(run_dir: Path, step: int, path: Path, adapter: set[str],
              snapshot: StateSnapshot, trainer_state: dict[str, Any], payload: str) -> None:
    """The writer thread's part: the rest of ``step-N``, fsynced, then ``state.json``. On
    failure what it added is removed (the adapter stays: the engine may be loading it)."""

    try:
        snapshot.write(path)
        torch.save(trainer_state, path / TRAINER_STATE_FILE)
        _fsync_files(path)
        atomic_write_bytes(path / STATE_FILE, payload.encode())
    except BaseException as exc:
        with contextlib.suppress(OSError):  # a read-only volume keeps them: still no state.json
            for child in path.iterdir():
                if child.name in adapter:
                    continue
                if child.is_dir():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        cause = os_error(exc)
        if cause is not None and not isinstance(exc, CheckpointWriteError):
            raise write_error(run_dir, step, cause) from exc
        raise


def _fsync_files(root: Path) -> None:
    """On disk before ``state.json`` says the checkpoint is complete."""

    for path in root.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
