"""A shortened ``make demo``: every service a real local process, two GRPO steps, the report
checked, and nothing left running afterwards."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from rich.console import Console

from mcprl_demo.cli import main
from mcprl_demo.config import load_demo_config
from mcprl_demo.demo_run import DemoRun
from mcprl_demo.display import results_table, wilson_interval

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
CHECKPOINT = REPO / "demo" / "checkpoints" / "warm-start"
# The demo's own config (same rollout/rendering setup as the warm start), made small.
SHORT = {"demo.scenarios": 16, "demo.val_fraction": 0.25, "trainer.steps": 2,
         "trainer.group_size": 2, "trainer.groups_per_step": 1,
         "trainer.eval.max_scenarios": 3, "trainer.eval.samples": 2,
         "trainer.eval.temperature": 1.0, "trainer.max_train_seconds": None,
         "trainer.rollout.max_turns": 6,
         "demo.model": str(CHECKPOINT)}


def _port_free(port: int) -> bool:
    """Nothing listens there (connections left in TIME_WAIT do not count)."""

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="module")
def checkpoint() -> Path:
    if not (CHECKPOINT / "config.json").exists():
        pytest.fail(f"{CHECKPOINT} is missing (it ships with the repo; rebuild: make warm-start)")
    return CHECKPOINT


@pytest.mark.timeout(420)
def test_short_demo_end_to_end(checkpoint: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    for var in ("JUDGE_BASE_URL", "JUDGE_API_KEY"):  # local mode whatever the shell says
        monkeypatch.delenv(var, raising=False)
    before_children = {p.pid for p in psutil.Process().children(recursive=True)}
    config = load_demo_config(REPO / "configs" / "demo.yaml",
                              overrides={**SHORT, "demo.output_dir": str(tmp_path / "out")},
                              env={})
    assert not config.hosted and config.strategy == "sql"
    outcome = DemoRun(config, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}).run()

    report = outcome.report
    assert report["steps_done"] == 2 and not report["stopped_early"]
    before, after = report["eval_before"], report["eval_after"]
    assert before["step"] == 0 and after["step"] == 2
    for ev in (before, after):
        assert ev["n"] == 6 and ev["failed_groups"] == 0  # 3 val scenarios x 2 samples
        assert 0.0 <= ev["success_rate"] <= 1.0 and 0.0 <= ev["mean_reward"] <= 1.0
        assert 1.0 <= ev["mean_turns"] <= 6.0
        assert ev["tool_calls"] > 0 and 0 <= ev["tool_errors"] <= ev["tool_calls"]
    # The warm-started agent acts: it calls tools and finishes with complete_task.
    assert before["finish_reasons"].get("completed", 0) >= 1
    assert [h["step"] for h in report["history"]] == [1, 2]
    assert all(h["rollouts"] == 2 for h in report["history"])
    png = outcome.paths["png"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert "| success_rate |" in outcome.paths["md"].read_text()
    assert "mcprl-index" in outcome.paths["html"].read_text()  # the page people look at
    saved = json.loads(outcome.paths["json"].read_text())
    assert saved["config"]["reward"]["mode"] == "verifiable"
    console = Console(record=True, width=160)
    console.print(results_table(outcome))
    table = " ".join(console.export_text().split())  # the title wraps at the table's width
    assert "T=1, 2 samples per scenario" in table and "val rollouts" in table
    lo, hi = wilson_interval(after["success_rate"], after["n"])
    assert f"{after['success_rate']:.1%} [{lo:.1%}, {hi:.1%}]" in table  # 6 rollouts: wide

    # Everything the demo started is gone: processes, process groups, ports.
    assert len(outcome.pids) == 5  # four services + the trainer
    for pid in outcome.pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie", pid
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before_children
    assert not left, f"child processes left running: {left}"
    assert outcome.ports and all(_port_free(p) for p in outcome.ports), outcome.ports

    # bench/demo_record.py turns the run into a row of docs/bench/demo-cpu-*.json.
    doc = tmp_path / "demo-bench.json"
    doc.write_text(json.dumps({"runs": [{"run": "short"}]}))
    subprocess.run([sys.executable, str(REPO / "bench" / "demo_record.py"),
                    str(outcome.paths["json"].parent), str(doc), "--name", "short", "--seed", "0",
                    "--command", "pytest"], check=True, timeout=60, capture_output=True)
    (row,) = json.loads(doc.read_text())["runs"]  # the same name replaces the old row
    assert [s["step"] for s in row["steps"]] == [1, 2] and row["steps_done"] == 2
    for key, ev in (("eval_before", before), ("eval_after", after)):
        assert row[key]["success_rate"] == ev["success_rate"] and row[key]["n"] == 6
        assert 0 <= row[key]["ran_the_query"] <= 6
    assert all(0.0 <= s["query_rate"] <= 1.0 for s in row["steps"])
    assert row["gain_points"] == round(100 * (after["success_rate"] - before["success_rate"]), 1)


@pytest.mark.timeout(60)
def test_cli_rejects_bad_arguments(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--steps", "0"])
    assert exc.value.code == 2
    assert "--steps must be >= 1" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_missing_model_fails_before_starting_anything(tmp_path: Path, monkeypatch,
                                                     capsys) -> None:
    monkeypatch.chdir(REPO)
    code = main(["--model", str(tmp_path / "nope"), "--out", str(tmp_path / "out")])
    assert code == 1
    assert "does not exist" in " ".join(capsys.readouterr().out.split())
    assert not (tmp_path / "out" / "stack").exists()
