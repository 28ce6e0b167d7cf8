"""Checkpoints: ``<run>/checkpoints/step-N/`` holds the LoRA adapter (peft format, what the
engine loads), the optimizer/scheduler/RNG state and ``state.json`` (step, history).

Written to a temporary directory and renamed into place, so a crash leaves either the
previous checkpoint or the complete new one. ``state.json`` is written last: a step directory
without it is ignored (a background save, :mod:`mcprl_trainer.checkpoint_writer`, renames the
adapter into ``step-N`` first and adds the rest, ``state.json`` last, in place). A full disk
or a read-only volume raises :class:`CheckpointWriteError`, which names the checkpoint that
is still intact (``--resume`` continues from it once there is room).
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "state.json"
TRAINER_STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, read-only, no permission)."""


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path

    def state(self) -> dict[str, Any]:
        return json.loads((self.path / STATE_FILE).read_text())


def checkpoints_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def list_checkpoints(run_dir: Path) -> list[Checkpoint]:
    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and (child / STATE_FILE).exists():
            found.append(Checkpoint(int(m.group(1)), child))
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(run_dir: Path) -> Checkpoint | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def state_payload(step: int, state: dict[str, Any]) -> str:
    """``state.json``'s text, taken when the save is asked for (the history grows later)."""

    return json.dumps({**state, "step": step, "saved_at": time.time()}, indent=1)


def temp_dir(root: Path, step: int) -> Path:
    """A fresh name that :func:`clean_temporaries` removes after a crash."""

    return root / f".tmp-step-{step}-{os.getpid()}-{time.time_ns()}"


def os_error(exc: BaseException) -> OSError | None:
    """The OSError behind a failed write: ``exc`` itself, or what dcp's CheckpointException
    (a BaseException) wraps, so a full disk under ``dcp/`` reads as one too."""

    if isinstance(exc, OSError):
        return exc
    for failure in getattr(exc, "failures", {}).values():
        inner = failure[0] if isinstance(failure, tuple) else failure
        if isinstance(inner, OSError):
            return inner
    return None


def write_error(run_dir: Path, step: int, exc: OSError) -> CheckpointWriteError:
    """The error a failed write raises: it names the checkpoint that is still intact."""

    intact = latest_checkpoint(run_dir)
    return CheckpointWriteError(
        exc.errno, f"cannot write checkpoint step-{step} in {checkpoints_dir(run_dir)}: "
        f"{exc.strerror or exc}; the latest complete checkpoint is "
        f"{intact.path.name if intact else 'none'} (--resume continues from it once "
        "the volume has room and is writable)")


def write_trainer_files(path: Path, trainer_state: dict[str, Any], payload: str) -> None:
    """``trainer_state.pt`` (with the RNG), then ``state.json``, which completes ``path``."""

    torch.save(trainer_state, path / TRAINER_STATE_FILE)
    with open(path / STATE_FILE, "w") as fh:
        fh.write(payload)
        fh.flush()
        os.fsync(fh.fileno())


def replace_atomically(run_dir: Path, step: int, tmp: Path,
                       write: Callable[[Path], None]) -> Checkpoint:
    """``write`` fills ``tmp`` (which exists), then it becomes ``step-N``; an older same-step
    checkpoint is put back if anything fails, and removed once the new one is in place."""

    root = checkpoints_dir(run_dir)
    final = root / f"step-{step}"
    old: Path | None = None
    try:
        write(tmp)
        _fsync_dir(tmp)
        if final.exists():
            old = root / f".old-step-{step}-{time.time_ns()}"
            os.rename(final, old)
        os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not final.exists():
            os.rename(old, final)  # the replaced same-step checkpoint stays
        cause = os_error(exc)
        if cause is not None and not isinstance(exc, CheckpointWriteError):
            raise write_error(run_dir, step, cause) from exc
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return Checkpoint(step, final)


def save_checkpoint(run_dir: Path, step: int, model: Any, trainer_state: dict[str, Any],
                    state: dict[str, Any]) -> Checkpoint:
    """Save atomically; returns the final checkpoint (an older same-step one is replaced)."""

    root = checkpoints_dir(run_dir)
    tmp = temp_dir(root, step)
    payload = state_payload(step, state)
    full = {**trainer_state, "rng": rng_state()}

    def write(path: Path) -> None:
        model.save_pretrained(str(path))
        write_trainer_files(path, full, payload)

    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as exc:
        raise write_error(run_dir, step, exc) from exc
    return replace_atomically(run_dir, step, tmp, write)


def load_trainer_state(checkpoint: Checkpoint) -> dict[str, Any]:
    return torch.load(checkpoint.path / TRAINER_STATE_FILE, weights_only=False)


def clean_temporaries(run_dir: Path) -> None:
    """Remove what a crash mid-save left behind (one trainer per run directory).

    A same-step re-save renames the old ``step-N`` away before the new one takes its place;
    a crash between the two renames leaves ``.old-step-N-*`` alone: it becomes ``step-N``
    again, so that step is not run twice.
    """

    root = checkpoints_dir(run_dir)
    if not root.is_dir():
        return
    for child in sorted(root.iterdir()):
        m = re.match(r"^\.old-step-(\d+)-", child.name)
        if m and (child / STATE_FILE).exists() and not (root / f"step-{m.group(1)}").exists():
            os.rename(child, root / f"step-{m.group(1)}")
        elif child.name.startswith((".tmp-step-", ".old-step-")):
            shutil.rmtree(child, ignore_errors=True)


def prune_checkpoints(run_dir: Path, keep: int, every: int = 0) -> None:
    """Keep the newest ``keep`` checkpoints (0 keeps all), and every ``every``-th step's."""

    if keep <= 0:
        return
    for ckpt in list_checkpoints(run_dir)[:-keep]:
        if every > 0 and ckpt.step % every == 0:
            continue
        shutil.rmtree(ckpt.path, ignore_errors=True)
