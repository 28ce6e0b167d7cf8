"""examples/art-tutorial end to end, as a user runs it (`make art-tutorial ART_ARGS=--quick`):
its own stack as local processes, ART's scenario generation, rollouts and RULER against it,
our judge, our GRPO step and the adapter served. About 70-100 s on two cores."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mcprl_art", reason="the ART extra is not installed (make setup-art)")

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parents[2]


def test_tutorial_runs_on_cpu(tmp_path) -> None:
    out = subprocess.run([sys.executable, str(REPO / "examples/art-tutorial/tutorial.py"),
                          "--quick", "--out", str(tmp_path)], capture_output=True, text=True,
                         timeout=560, cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    scen = summary["scenarios"]
    assert scen["requested"] == 3
    # ART's generator ran against our engine; what the store kept round-trips to ART
    assert "error" in scen or (scen["generated"] == 3 and scen["round_trip"])
    assert scen["train"] >= 2 and scen["val"] >= 1
    assert summary["rollouts"] == {**summary["rollouts"], "groups": 2, "trajectories": 6}
    ruler = summary["ruler"]
    assert len(ruler["art_ruler_score_group"]) == len(ruler["our_judge"]) == 2
    for scores in ruler["our_judge"]:
        assert scores is None or (len(scores) == 3 and all(0 <= s <= 1 for s in scores))
    train = summary["train"]
    assert train["groups"] == sum(s is not None for s in ruler["our_judge"])
    assert Path(train["checkpoint"], "adapter_model.safetensors").is_file()
    assert summary["after"]["model"] == train["adapter"] == "art-tutorial"
    logs = (tmp_path / "stack" / "logs").glob("*.log")
    assert {p.stem for p in logs} >= {"mcp-server", "inference", "judge"}
