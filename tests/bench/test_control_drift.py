"""bench/control_drift.py on the CPU: the real expert's rows (MCP server, scenario generation,
scripted expert), the trainer's real update on the tiny model, true and shuffled rewards."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mcprl_demo.warmstart import main as warmstart

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]


def test_true_rewards_move_the_decision_and_the_json_says_so(
        tmp_path: Path, tiny_test_model: Path, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    work = tmp_path / "work"
    config = {
        "seed": 0, "work_dir": str(work), "output_dir": str(tmp_path / "unused"),
        "trainer_config": "configs/demo.yaml",
        "base": {"path": str(tiny_test_model), "spec": None},
        "scenarios": {"n": 40, "val_fraction": 0.25, "train_db_seeds": [1],
                      "include_eval_db_train": False, "exclude_val_entities": False},
        "expert": {"noise": 0.5, "noise_kind": "guess", "concurrency": 4},
    }
    path = tmp_path / "warmstart.yaml"
    path.write_text(yaml.safe_dump(config))
    assert warmstart(["--config", str(path), "--stages", "scenarios,expert"]) == 0

    out = tmp_path / "drift.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "control_drift.py"), "--rows",
         str(work / "sft.jsonl"), "--base-model", str(tiny_test_model), "--warm-start", "none",
         "--device", "cpu", "--steps", "2", "--probe-every", "2", "--probe-rows", "2",
         "--shuffled-seeds", "1", "--group-size", "4", "--query-share", "0.5",
         "--p-success", "1", "0", "--variant", "adamw:lr=3e-2,groups=2",
         "--variant", "sgd:opt=sgd,lr=3,groups=2", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert json.loads(proc.stdout) == {k: {kk: vv for kk, vv in v.items() if kk != "runs"}
                                       for k, v in result["variants"].items()}
    assert result["setup"]["probe_rows"] == 4
    for name in ("adamw", "sgd"):
        variant = result["variants"][name]
        # Querying always succeeds and guessing never does: the decision moves to run_query.
        assert variant["true"]["delta_logit_mean"] > 0, variant
        assert len(variant["shuffled"]["delta_logit"]) == 1
        assert [r["arm"] for r in variant["runs"]] == ["true", "shuffled"]
        assert all(r["curve"][0]["step"] == 0 and r["curve"][-1]["step"] == 2
                   for r in variant["runs"])
