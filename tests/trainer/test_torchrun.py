"""``torchrun --nproc-per-node 2 mcprl-train``: one GRPO step of the real run on two gloo
ranks against the stack, then ``--resume`` on one process continues from the 2-rank
checkpoint (dcp across a change of world size)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mcprl_common.process import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _run(argv: list[str], log: Path, timeout_s: float = 150) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with log.open("ab") as out:
        proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                              timeout=timeout_s, check=False)
    text = log.read_text()
    errors = [line for line in text.splitlines() if "Error" in line]  # every rank's cause
    assert proc.returncode == 0, "\n".join(errors[:20]) + "\n...\n" + text[-3000:]


def test_two_ranks_train_and_one_resumes(stack, tmp_path: Path) -> None:
    data = stack.run_config(tmp_path, name="ddp", steps=1,
                            train={"lr": 1e-3, "device": "cpu", "skip_zero_variance": False})
    config = tmp_path / "ddp.yaml"
    config.write_text(yaml.safe_dump(data))
    log = tmp_path / "train.log"
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
          "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
          "-m", "mcprl_trainer.cli", "--config", str(config), "--no-progress", "--log-json"],
         log)
    run_dir = Path(data["output_dir"]) / "ddp"
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert rows[0]["train_ranks"] == 2.0 and rows[0]["train_samples"] > 0
    step1 = run_dir / "checkpoints" / "step-1"
    assert (step1 / "dcp" / ".metadata").is_file()
    assert (step1 / "adapter_model.safetensors").is_file()

    _run([sys.executable, "-m", "mcprl_trainer.cli", "--config", str(config), "--resume",
          "--steps", "2", "--no-progress", "--log-json"], log)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[1]["train_ranks"] == 1.0
    assert "resumed from" in log.read_text()
