"""Writes ``report.html`` and its per-step data files (``report-data/``) into a run directory.

The page is one file with its CSS, its script and the run's index inline; each step's and
each eval's rollouts are a script beside it (``report-data/train-0007.js``) that the page adds
as a ``<script>`` when that step is opened, which works from ``file://`` where ``fetch`` does
not. Every file is replaced atomically, data files before the page that names them.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import logging
import math
import re
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

from mcprl_trainer.html_report.data import (
    DATA_DIR,
    Kind,
    build_index,
    data_name,
    read_config,
    step_data,
    success_threshold,
)
from mcprl_trainer.run_files import (
    atomic_write_text,
    eval_rollouts_path,
    read_jsonl,
    train_rollouts_path,
)

log = logging.getLogger(__name__)
REPORT_NAME = "report.html"
# Inside <script> only "</script", "<!--" and U+2028/2029 can break out or break parsing;
# escaping every <, > and & is simpler and covers them all. They occur only inside JSON
# strings, where \\uXXXX means the same character.
_UNSAFE = re.compile("[<>&\u2028\u2029]")


def _finite(value: Any) -> Any:
    """NaN and infinities as null: JSON has no spelling for them."""

    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def script_json(value: Any) -> str:
    """JSON that is safe to put between ``<script>`` tags, as JS or as JSON."""

    text = json.dumps(_finite(value), ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False, default=str)
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _static(name: str) -> str:
    return resources.files("mcprl_trainer.html_report").joinpath("static", name).read_text(
        encoding="utf-8")


def render_page(index: dict[str, Any]) -> str:
    page = _static("page.html")
    script = _static("report.js")
    # The page allows only its own inline script (by hash) and the data files beside it, so
    # even markup that escaped escaping could not run.
    digest = base64.b64encode(hashlib.sha256(f"\n{script}\n".encode()).digest()).decode()
    parts = {"@@TITLE@@": html.escape(f"mcp-rl run {index['run'].get('name')}"),
             "@@SCRIPT_HASH@@": f"sha256-{digest}", "/*@@CSS@@*/": _static("report.css"),
             "/*@@JS@@*/": script, "@@INDEX@@": script_json(index)}
    # One pass, so that nothing substituted is searched for markers again.
    return re.sub("|".join(re.escape(k) for k in parts), lambda m: parts[m.group()], page)


def write_step_data(run_dir: Path, kind: Kind, step: int, threshold: float) -> bool:
    """Convert one step's (or eval's) rollouts JSONL to its data files; False if it has none."""

    source = (train_rollouts_path if kind == "train" else eval_rollouts_path)(run_dir, step)
    rows = read_jsonl(source)
    if not rows:
        return False
    data = step_data(kind, step, rows, threshold)
    out = run_dir / DATA_DIR
    atomic_write_text(out / data_name(kind, step, "js"),
                      f"mcprlReport.receive({script_json(kind)},{step},"
                      f"{script_json(data.detail)});\n")
    atomic_write_text(out / data_name(kind, step, "json"), script_json(data.summary))
    return True


def update_report(run_dir: Path, *, steps: Iterable[int] = (),
                  evals: Iterable[int] = ()) -> Path:
    """Add the given steps' and evals' rollouts, and those of any recorded step whose data
    files are missing (a process killed between its checkpoint and its report), then rewrite
    the page. What the trainer calls after each step: it costs one step's rollouts plus the
    index."""

    threshold = success_threshold(read_config(run_dir))
    out = run_dir / DATA_DIR
    for kind, given, recorded in (
            ("train", steps, run_dir / "metrics.jsonl"), ("eval", evals, run_dir / "evals.jsonl")):
        known = {int(row["step"]) for row in read_jsonl(recorded)}
        missing = {s for s in known if not (out / data_name(kind, s, "json")).exists()}
        for step in sorted(set(given) | missing):
            write_step_data(run_dir, kind, step, threshold)  # type: ignore[arg-type]
    page = run_dir / REPORT_NAME
    atomic_write_text(page, render_page(build_index(run_dir)))
    return page


def rebuild_report(run_dir: Path) -> Path:
    """The whole report again from the run's files (``mcprl-train report RUN_DIR``)."""

    if not (run_dir / "metrics.jsonl").exists() and not (run_dir / "config.yaml").exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no metrics.jsonl or "
                                "config.yaml)")
    steps = [int(h["step"]) for h in read_jsonl(run_dir / "metrics.jsonl")]
    evals = [int(e["step"]) for e in read_jsonl(run_dir / "evals.jsonl")]
    page = update_report(run_dir, steps=steps, evals=evals)
    keep = {data_name("train", s, ext) for s in steps for ext in ("js", "json")}
    keep |= {data_name("eval", s, ext) for s in evals for ext in ("js", "json")}
    for path in (run_dir / DATA_DIR).glob("*"):
        if path.is_file() and path.name not in keep:  # steps a resumed run redid or dropped
            path.unlink()
    return page


def update_report_safely(run_dir: Path, **kwargs: Any) -> Path | None:
    """``update_report`` for the training loop: a report problem is logged, never fatal."""

    try:
        return update_report(run_dir, **kwargs)
    except Exception as exc:
        log.warning("run report not written", extra={"reason": f"{type(exc).__name__}: {exc}"})
        return None
