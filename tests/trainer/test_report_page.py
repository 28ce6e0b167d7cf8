"""The run report's files without a browser: what the trainer records, how untrusted text is
encoded, that the files are bounded, written atomically, rebuilt by ``mcprl-train report``,
and need nothing from the network."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mcprl_testing.html_report import synthetic_run
from mcprl_trainer.cli import main
from mcprl_trainer.html_report import REPORT_NAME, rebuild_report, update_report
from mcprl_trainer.html_report.data import DATA_DIR
from mcprl_trainer.html_report.views import MAX_TEXT, messages_view, queried
from mcprl_trainer.html_report.writer import script_json
from mcprl_trainer.run_files import read_jsonl, train_rollouts_path, write_jsonl

pytestmark = pytest.mark.timeout(60)


def _index(page: Path) -> dict:
    text = page.read_text()
    raw = re.search(r'<script type="application/json" id="mcprl-index">(.*?)</script>', text,
                    re.S)
    assert raw is not None
    return json.loads(raw.group(1))


def test_script_json_cannot_close_a_script_and_round_trips() -> None:
    value = {"a": "</script><script>alert(1)</script>", "b": "<!-- x --> & </textarea>",
             "c": "line\u2028sep\u2029end", "nan": float("nan"), "inf": [float("inf"), 1.5]}
    text = script_json(value)
    for bad in ("<", ">", "&", "\u2028", "\u2029", "NaN", "Infinity"):
        assert bad not in text
    back = json.loads(text)
    assert back["a"] == value["a"] and back["b"] == value["b"] and back["c"] == value["c"]
    assert back["nan"] is None and back["inf"] == [None, 1.5]


def test_a_run_report_is_written_from_the_run_files(tmp_path: Path) -> None:
    run = synthetic_run(tmp_path, steps=3, groups=2, group_size=4, evals=(0, 3))
    page = rebuild_report(run)
    assert page == run / REPORT_NAME
    names = sorted(p.name for p in (run / DATA_DIR).iterdir())
    assert names == ["eval-0000.js", "eval-0000.json", "eval-0003.js", "eval-0003.json",
                     *[f"train-000{s}.{ext}" for s in (1, 2, 3) for ext in ("js", "json")]]
    assert not list(run.rglob(".*.tmp"))  # atomic writes leave no temporaries
    assert page.stat().st_mode & 0o777 == 0o644  # readable by whoever opens it
    index = _index(page)
    assert index["run"]["name"] == "synthetic" and index["run"]["steps_done"] == 3
    assert index["train"]["steps"] == [1, 2, 3] and index["eval"]["steps"] == [0, 3]
    assert len(index["train"]["cols"]["step"]) == 3 * 2 * 4
    assert len(index["eval"]["cols"]["step"]) == 2 * 6 * 2
    rows = read_jsonl(train_rollouts_path(run, 2))
    cols = index["train"]["cols"]
    at = [i for i, s in enumerate(cols["step"]) if s == 2]
    assert [cols["reward"][i] for i in at] == [r["reward"] for r in rows]
    assert [cols["advantage"][i] for i in at] == [r["advantage"] for r in rows]
    assert [cols["errors"][i] for i in at] == [r["trajectory"]["tool_errors"] for r in rows]
    detail = (run / DATA_DIR / "train-0002.js").read_text()
    assert detail.startswith('mcprlReport.receive("train",2,{')
    assert "\"tools\"" not in detail  # the tool schemas stay in the JSONL only
    # Offline: nothing is loaded from anywhere but the page and its data folder.
    text = page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "@import" not in text and "url(" not in text


def test_the_index_follows_the_run_when_a_step_is_redone(tmp_path: Path) -> None:
    """A resumed run rewrites metrics.jsonl without the steps after its checkpoint: their
    data files may exist but are not in the index, and a rebuild removes them; a recorded
    step without data files gets them at the next update."""

    run = synthetic_run(tmp_path, steps=4, groups=1, group_size=2)
    rebuild_report(run)
    write_jsonl(run / "metrics.jsonl", read_jsonl(run / "metrics.jsonl")[:2])
    page = update_report(run)
    assert _index(page)["train"]["steps"] == [1, 2]
    assert (run / DATA_DIR / "train-0004.js").exists()
    rebuild_report(run)
    assert not (run / DATA_DIR / "train-0004.js").exists()
    # Killed after a step's checkpoint but before its report: the next update adds it.
    for ext in ("js", "json"):
        (run / DATA_DIR / f"train-0002.{ext}").unlink()
    update_report(run)
    assert (run / DATA_DIR / "train-0002.js").exists()
    assert _index(update_report(run))["train"]["steps"] == [1, 2]


def test_long_untrusted_text_is_clipped_in_the_page_data(tmp_path: Path) -> None:
    run = synthetic_run(tmp_path, steps=1, groups=1, group_size=2)
    path = train_rollouts_path(run, 1)
    rows = read_jsonl(path)
    rows[0]["trajectory"]["messages"][3]["content"] = "y" * 1_000_000
    rows[0]["explanation"] = "z" * 50_000
    write_jsonl(path, rows)
    rebuild_report(run)
    detail = (run / DATA_DIR / "train-0001.js").read_text()
    assert len(detail) < 2 * MAX_TEXT + 20_000  # two rollouts of a few short messages
    assert "more characters in the run's JSONL" in detail


def test_tool_results_are_marked_as_errors_from_the_recorded_ids() -> None:
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "a", "function": {"name": "run_query", "arguments": '{"sql": "x"}'}},
                    {"id": "b", "function": {"name": "list_tables", "arguments": "{"}}]},
                {"role": "tool", "tool_call_id": "a", "content": "Error-free rows: 3"},
                {"role": "tool", "tool_call_id": "b", "content": "no such table"}]
    tools = [{"type": "function", "function": {"name": "run_query"}}]
    view = messages_view({"messages": messages, "metadata": {"tool_error_ids": ["b"]}})
    assert [m.get("error") for m in view] == [None, None, False, True]
    assert view[1]["calls"][0]["args"] == '{\n "sql": "x"\n}' and view[1]["calls"][1]["args"] == "{"
    assert view[1]["content"] == ""
    # Rows from before the ids were recorded: the trainer's "Error..." prefix marks them.
    old = messages_view({"messages": messages, "metadata": {}})
    assert [m.get("error") for m in old] == [None, None, True, False]
    assert queried({"messages": messages, "tools": tools})
    assert not queried({"messages": messages[:1], "tools": tools})


def test_mcprl_train_report_rebuilds_and_refuses_what_is_not_a_run(tmp_path: Path,
                                                                   capsys) -> None:
    run = synthetic_run(tmp_path, steps=2, groups=1, group_size=2)
    assert main(["report", str(run)]) == 0
    assert capsys.readouterr().out.strip() == str(run / REPORT_NAME)
    assert (run / REPORT_NAME).exists()
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "is not a run directory" in capsys.readouterr().err
    train_rollouts_path(run, 1).write_text("{not json\n")
    assert main(["report", str(run)]) == 2
    assert "mcprl-train report:" in capsys.readouterr().err
