"""The warm-start recipe end to end, made tiny: real MCP servers (two databases), scenario
generation, the expert, SFT of the tiny test model and the held-out eval through our engine."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml

from mcprl_demo.warmstart import main

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
REPO = Path(__file__).resolve().parents[2]


def test_recipe_runs_every_stage(tmp_path: Path, tiny_test_model: Path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    work, out = tmp_path / "work", tmp_path / "model"
    config = {
        "seed": 1, "work_dir": str(work), "output_dir": str(out),
        "trainer_config": "configs/demo.yaml",
        "base": {"path": str(tiny_test_model), "spec": None},
        "scenarios": {"n": 40, "val_fraction": 0.25, "train_db_seeds": [1],
                      "include_eval_db_train": False, "exclude_val_entities": False},
        "expert": {"noise": 0.0, "concurrency": 4},
        "sft": {"steps": 3, "batch_size": 2, "lr": 1e-3, "warmup_steps": 1, "device": "cpu",
                "shared_prefix": True, "log_every": 1, "save_dtype": "bfloat16"},
        # The 3-step model emits noise: short eval rollouts, or noise runs to 6 x 160 tokens.
        "eval": {"max_scenarios": 2, "concurrency": 2, "base_too": False, "max_turns": 2,
                 "max_tokens_per_turn": 24},
    }
    path = tmp_path / "warmstart.yaml"
    path.write_text(yaml.safe_dump(config))
    before = {p.pid for p in psutil.Process().children(recursive=True)}

    assert main(["--config", str(path)]) == 0

    set_dirs = [d for d in (work / "scenarios").iterdir() if (d / "val.jsonl").exists()]
    combined = [d for d in set_dirs if d.name.startswith("sql-")]
    assert len(combined) == 1
    train = [json.loads(x) for x in (combined[0] / "train.jsonl").read_text().splitlines()]
    val = [json.loads(x) for x in (combined[0] / "val.jsonl").read_text().splitlines()]
    assert train and val
    assert {s["metadata"]["db_seed"] for s in train} == {1}  # the eval DB is never trained on
    assert {s["metadata"]["db_seed"] for s in val} == {42}
    expert = json.loads((work / "expert.json").read_text())
    assert expert["expert_success_rate"] > 0.95 and expert["kept"] >= 0.9 * len(train)
    rows = [json.loads(x) for x in (work / "sft.jsonl").read_text().splitlines()]
    assert len(rows) == expert["kept"] and all(len(r["input_ids"]) == len(r["mask"])
                                               for r in rows)
    sft = json.loads((work / "sft.json").read_text())
    assert sft["steps"] == 3 and sft["trained_tokens"] > 0
    info = json.loads((out / "warmstart.json").read_text())
    assert info["sft"]["rows"] == len(rows)
    assert info["heldout"]["after_sft"]["n"] == 2
    assert 0.0 <= info["heldout"]["after_sft"]["success_rate"] <= 1.0
    assert (out / "tokenizer.json").exists() and (out / "chat_template.jinja").exists()
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not left, f"processes left running: {left}"


def test_sigterm_stops_the_services_it_started(tmp_path: Path, tiny_test_model: Path) -> None:
    """SIGTERM mid-stage: the recipe exits 130 and its MCP servers are stopped with it."""

    config = {
        "seed": 1, "work_dir": str(tmp_path / "work"), "output_dir": str(tmp_path / "model"),
        "trainer_config": "configs/demo.yaml",
        "base": {"path": str(tiny_test_model), "spec": None},
        "scenarios": {"n": 40, "val_fraction": 0.25, "train_db_seeds": [1, 2, 3]},
    }
    path = tmp_path / "warmstart.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.Popen([sys.executable, "-m", "mcprl_demo.warmstart", "--config", str(path),
                             "--stages", "scenarios,expert"], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if "MCP server (database seed" in line:
            break
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children, "".join(lines)
    proc.send_signal(signal.SIGTERM)
    out = "".join(lines) + proc.communicate(timeout=60)[0]
    assert proc.returncode == 130, out
    assert "interrupted (SIGTERM)" in out
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left running: {[p.pid for p in alive]}\n{out}"
