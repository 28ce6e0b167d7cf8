"""The CLI: generate (sql) -> export in ART's shape -> import back; errors exit non-zero."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mcprl_common.process import free_port
from mcprl_common.wire import Scenario
from mcprl_scenario_gen.cli import main
from mcprl_scenario_gen.store import ScenarioStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(argv))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def test_generate_export_import_round_trip(company, tmp_path: Path, capsys) -> None:
    url, _ = company
    data = tmp_path / "sets"
    code, out, err = run_cli(capsys, "generate", "--mcp-url", url, "--strategy", "sql",
                             "--n", "20", "--seed", "0", "--holdout", "templates",
                             "--difficulty-mix", "1=1,2=1,3=1,4=1,5=1", "--out", str(data))
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["status"] == "succeeded" and result["counts"]["total"] == 20
    set_dir = Path(result["path"])
    assert sorted(p.name for p in set_dir.iterdir()) == ["manifest.json", "train.jsonl",
                                                         "val.jsonl"]
    assert "scenario set" in err  # the rich summary table

    art_file = tmp_path / "train.art.json"
    code, _, err = run_cli(capsys, "export", result["id"], "--format", "art", "--split",
                           "train", "-o", str(art_file), "--data-dir", str(data))
    assert code == 0, err
    exported = json.loads(art_file.read_text())
    assert len(exported) == result["counts"]["train"]
    assert all(set(item) == {"task", "difficulty"} for item in exported)

    code, out, err = run_cli(capsys, "import", "--format", "art", str(art_file),
                             "--data-dir", str(data), "--val-fraction", "0.25")
    assert code == 0, err
    imported = json.loads(out.strip().splitlines()[-1])
    store = ScenarioStore(data)
    back = store.load_split(imported["id"], "train") + store.load_split(imported["id"], "val")
    assert sorted(s.task for s in back) == sorted(item["task"] for item in exported)
    assert all(s.id == Scenario.content_id(s.task) and s.strategy == "import:art" for s in back)
    assert imported["counts"]["val"] == round(len(exported) * 0.25)


def test_import_keeps_given_splits_and_skips_bad_items(tmp_path: Path, capsys) -> None:
    src = tmp_path / "art.json"
    src.write_text(json.dumps({
        "train": [{"task": "Which department has the largest budget? Name only.",
                   "difficulty": 2},
                  {"task": "Which department has the largest budget? Name only.",
                   "difficulty": 2},
                  {"difficulty": 3}],
        "test": [{"task": "How many projects are on hold? Number only.", "difficulty": 1}]}))
    code, out, err = run_cli(capsys, "import", str(src), "--data-dir", str(tmp_path / "d"))
    assert code == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["counts"] == {"train": 1, "val": 1, "total": 2}
    assert "skipped 2 invalid or duplicate items" in err


def test_generate_errors_exit_non_zero(tmp_path: Path, capsys) -> None:
    dead = f"http://127.0.0.1:{free_port()}/mcp"
    code, _, err = run_cli(capsys, "generate", "--mcp-url", dead, "--out", str(tmp_path))
    assert code == 2 and "unreachable" in err
    code, _, err = run_cli(capsys, "generate", "--mcp-url", dead, "--n", "999999",
                           "--out", str(tmp_path))
    assert code == 2 and "maximum" in err
    assert not list(tmp_path.iterdir())  # nothing half-made on disk


def test_console_script_lists_subcommands() -> None:
    exe = Path(sys.executable).parent / "mcprl-scenario-gen"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    for sub in ("serve", "generate", "export", "import"):
        assert sub in out.stdout
