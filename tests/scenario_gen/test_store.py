"""Storage: atomic writes (even under SIGKILL), manifests, recovery of interrupted sets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mcprl_common.errors import BadRequestError, NotFoundError
from mcprl_common.wire import Scenario, ScenarioSetManifest
from mcprl_scenario_gen.pipeline import new_manifest, recover_interrupted
from mcprl_scenario_gen.store import ScenarioStore, atomic_write_bytes
from mcprl_scenario_gen.strategies import GenerationParams

pytestmark = pytest.mark.timeout(60)


def sc(task: str, difficulty: int = 3) -> Scenario:
    return Scenario(id=Scenario.content_id(task), task=task, difficulty=difficulty)


WRITER = r"""
import sys
from pathlib import Path
from mcprl_common.wire import Scenario
from mcprl_scenario_gen.store import ScenarioStore
store = ScenarioStore(Path(sys.argv[1]))
i = 0
print("ready", flush=True)
while True:
    size = 2000 + (i % 7) * 500
    items = [Scenario(id=f"sc-{i}-{k}", task=f"version {i} task {k} " + "x" * 200,
                      difficulty=1 + k % 5) for k in range(size)]
    store.save_split("ss-kill", "train", items)
    i += 1
"""


def test_sigkill_mid_write_never_leaves_a_partial_file(tmp_path: Path) -> None:
    """A writer is killed at random moments; the file is always one complete version."""

    repo = Path(__file__).resolve().parents[2]
    target = tmp_path / "ss-kill" / "train.jsonl"
    seen_sizes = set()
    for delay in (0.35, 0.6, 0.9):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], cwd=repo,
                                stdout=subprocess.PIPE)
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        if not target.exists():
            continue
        lines = target.read_bytes().split(b"\n")
        assert lines[-1] == b""  # ends with a complete line
        rows = [json.loads(line) for line in lines[:-1]]
        versions = {r["task"].split()[1] for r in rows}
        assert len(versions) == 1  # never two versions mixed
        assert len(rows) in {2000 + j * 500 for j in range(7)}
        seen_sizes.add(len(rows))
    assert seen_sizes, "the writer never finished one file"
    # Leftover temp files are invisible as sets and removed by cleanup.
    store = ScenarioStore(tmp_path)
    store.cleanup_tmp()
    assert sorted(p.name for p in (tmp_path / "ss-kill").iterdir()) == ["train.jsonl"]


def test_atomic_write_replaces_whole_file(tmp_path: Path) -> None:
    path = tmp_path / "a" / "f.json"
    atomic_write_bytes(path, b"one")
    atomic_write_bytes(path, b"two")
    assert path.read_bytes() == b"two"
    assert [p.name for p in path.parent.iterdir()] == ["f.json"]


def test_manifest_round_trip_and_is_a_common_manifest(tmp_path: Path) -> None:
    store = ScenarioStore(tmp_path)
    params = GenerationParams(mcp_url="http://x/mcp", strategy="sql", n=3, seed=4,
                              auth_token="s3cret")
    manifest = new_manifest(store.new_set_id(), params)
    items = [sc(f"question number {i} here", 1 + i) for i in range(3)]
    store.write_set(manifest, items[:2], items[2:])
    loaded = store.load_manifest(manifest.id)
    assert loaded.files == {"train": "train.jsonl", "val": "val.jsonl"}
    raw = (store.set_dir(manifest.id) / "manifest.json").read_text()
    assert "s3cret" not in raw and json.loads(raw)["params"]["auth"] is True
    assert ScenarioSetManifest.model_validate_json(raw).seed == 4  # readable by common model
    assert [s.id for s in store.load_split(manifest.id, "val")] == [items[2].id]
    with pytest.raises(NotFoundError):
        store.load_manifest("ss-missing")
    with pytest.raises(BadRequestError):
        store.set_dir("../etc")


def test_recover_interrupted_keeps_checkpointed_candidates(tmp_path: Path) -> None:
    store = ScenarioStore(tmp_path)
    params = GenerationParams(mcp_url="http://x/mcp", strategy="llm", n=10, val_fraction=0.2)
    manifest = new_manifest(store.new_set_id(), params)
    manifest.status = "running"
    store.save_manifest(manifest)
    store.save_checkpoint(manifest.id, [sc(f"task number {i} of many words", 1 + i % 5)
                                        for i in range(6)])
    assert recover_interrupted(store) == [manifest.id]
    loaded = store.load_manifest(manifest.id)
    assert loaded.status == "failed" and "interrupted" in (loaded.error or "")
    assert loaded.counts["total"] == 6
    assert len(store.load_split(manifest.id, "train")) + len(
        store.load_split(manifest.id, "val")) == 6
    assert not (store.set_dir(manifest.id) / "candidates.jsonl").exists()
    assert recover_interrupted(store) == []  # idempotent
