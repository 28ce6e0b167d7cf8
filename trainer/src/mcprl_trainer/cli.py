"""``mcprl-train --config FILE [--resume]``: one training run, with progress bars.
``mcprl-train report RUN_DIR``: write the run's ``report.html`` again from its files.

SIGTERM/SIGINT stop the run gracefully after the current step (its checkpoint is written, so
``--resume`` continues with the next step); a second signal stops at once.

Under ``torchrun --nproc-per-node N mcprl-train --config FILE`` the update is sharded over N
processes (FSDP2, :mod:`mcprl_trainer.distributed`): rank 0 is the run as above, the other
ranks only take their share of each update and of each checkpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import signal
import sys
import threading
from pathlib import Path

from mcprl_common.logging import configure_logging
from mcprl_common.process import raise_open_files_limit
from mcprl_trainer.checkpoint import CheckpointWriteError, latest_checkpoint
from mcprl_trainer.config import RunConfig, load_config
from mcprl_trainer.distributed import DistContext, destroy, init_distributed
from mcprl_trainer.html_report import rebuild_report
from mcprl_trainer.modeling import resolve_device
from mcprl_trainer.trainer import RunExistsError, Trainer
from mcprl_trainer.update_group import UpdateGroup

log = logging.getLogger("mcprl_trainer")
# A volume that is full, read-only or not ours: told plainly, not as a traceback.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EFBIG})


class RichProgress:
    """A bar for the current phase and a compact line per step, on stderr."""

    def __init__(self, enabled: bool = True, *, json_lines: bool = False) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.console = Console(stderr=True)
        self.enabled = enabled and self.console.is_terminal
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=self.console, transient=True)
        self.task = None
        self.json_lines = json_lines
        if self.enabled:
            self.bar.start()

    def phase(self, name: str, total: int | None = None) -> None:
        if not self.enabled:
            return
        if self.task is not None:
            self.bar.remove_task(self.task)
        self.task = self.bar.add_task(name, total=total)

    def advance(self) -> None:
        if self.enabled and self.task is not None:
            self.bar.advance(self.task)

    def step_done(self, line: str) -> None:
        if self.json_lines:  # machine-read logs: the line is a log record like the others
            log.info(line)
        else:
            self.console.print(line, highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self.enabled:
            self.bar.stop()


def _install_signals(stop: threading.Event) -> None:
    def handler(signum: int, _frame: object) -> None:
        if stop.is_set():
            signal.signal(signum, signal.SIG_DFL)
            raise KeyboardInterrupt
        stop.set()
        print(f"\n{signal.Signals(signum).name}: stopping after the current step "
              "(send again to stop now)", file=sys.stderr, flush=True)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def follower_main(config: RunConfig, ctx: DistContext) -> int:
    """A rank > 0: its share of every update until rank 0 says stop. Signals are rank 0's
    to act on (torchrun sends them to every rank); this rank stops when told."""

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    try:
        UpdateGroup(config, ctx).follow()
    finally:
        destroy()
    return 0


def report_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="mcprl-train report",
                                     description="Write RUN_DIR/report.html again from the "
                                     "run's metrics, evals and rollouts.")
    parser.add_argument("run_dir", type=Path, help="a run directory (runs/<name>)")
    args = parser.parse_args(argv)
    try:
        page = rebuild_report(args.run_dir)
    except (FileNotFoundError, ValueError, KeyError) as exc:  # not a run, or damaged files
        print(f"mcprl-train report: {exc}", file=sys.stderr)
        return 2
    print(page)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["report"]:
        return report_main(argv[1:])
    parser = argparse.ArgumentParser(
        prog="mcprl-train", description=__doc__.splitlines()[0],
        epilog="mcprl-train report RUN_DIR writes a run's report.html again.")
    parser.add_argument("--config", type=Path, required=True, help="run YAML (see configs/)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the run's latest checkpoint")
    parser.add_argument("--steps", type=int, help="override the config's steps")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    parser.add_argument("--log-json", action="store_true", help="JSON log lines")
    args = parser.parse_args(argv)
    raise_open_files_limit()  # every concurrent rollout holds MCP + engine sockets
    configure_logging("trainer", "info", args.log_json)
    for noisy in ("httpx2", "httpcore2", "mcp", "fastmcp", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    overrides = {"steps": args.steps} if args.steps is not None else None
    try:
        config = load_config(args.config, overrides=overrides)
    except Exception as exc:  # validation errors: say what is wrong, no traceback
        print(f"mcprl-train: invalid config {args.config}: {exc}", file=sys.stderr)
        return 2
    dist_ctx = init_distributed(resolve_device(config.train.device))
    if not dist_ctx.is_main:
        return follower_main(config, dist_ctx)
    stop = threading.Event()
    _install_signals(stop)
    progress = RichProgress(enabled=not args.no_progress, json_lines=args.log_json)
    try:
        outcome = asyncio.run(Trainer(config, resume=args.resume, stop=stop,
                                      progress=progress, dist=dist_ctx).run())
    except RunExistsError as exc:
        print(f"mcprl-train: {exc}", file=sys.stderr)
        return 2
    except CheckpointWriteError as exc:  # disk full, read-only volume: say so, no traceback
        print(f"mcprl-train: {exc.strerror}", file=sys.stderr)
        return 1
    except OSError as exc:
        if exc.errno not in DISK_ERRNOS:
            raise
        intact = latest_checkpoint(config.run_dir)
        print(f"mcprl-train: cannot write the run's files in {config.run_dir}: {exc.strerror}"
              f"; the latest complete checkpoint is {intact.path.name if intact else 'none'} "
              "(--resume continues from it once the volume has room and is writable)",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("mcprl-train: interrupted; resume with --resume", file=sys.stderr)
        return 130
    finally:
        progress.close()
        destroy()
    state = "stopped early" if outcome.stopped_early else "done"
    print(f"mcprl-train: {state} after step {outcome.steps_done}; report: "
          f"{outcome.report['html']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
