"""A full disk or a read-only volume under a checkpoint, a scenario-set write and a judge-cache
write: a clear error, the previous data still loadable, no partial file read later; and the
judge cache survives a SIGKILL in the middle of its writes.

The volumes are small tmpfs mounts (so these tests need root, as CI has; elsewhere they are
skipped), filled with a filler file or remounted read-only. Cost: ~40 s (one 3-step run).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from mcprl_common.process import UvicornThread

pytestmark = [pytest.mark.faults, pytest.mark.timeout(240)]


class Volume:
    """A tmpfs of ``size`` mounted at ``path``: fill it, free it, make it read-only."""

    def __init__(self, path: Path, size: str) -> None:
        self.path = path
        self.size = size
        self.filler = path / ".filler"

    def _mount(self, *args: str) -> None:
        subprocess.run(["mount", *args], check=True, capture_output=True, timeout=30)

    def fill(self) -> None:
        """Write a filler file until the volume has no byte left."""

        with open(self.filler, "ab") as fh:
            try:
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
        with contextlib.suppress(OSError), open(self.filler, "ab") as fh:  # the last bytes
            while True:
                fh.write(b"\0")
                fh.flush()

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def read_only(self, on: bool = True) -> None:
        self._mount("-o", f"remount,{'ro' if on else 'rw'}", str(self.path))


@pytest.fixture
def volume(tmp_path: Path) -> Iterator[Callable[..., Volume]]:
    mounted: list[Volume] = []

    def make(name: str, size: str = "4m") -> Volume:
        if os.geteuid() != 0:
            pytest.skip("mounting a small tmpfs needs root")
        path = tmp_path / name
        path.mkdir()
        try:
            subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                           check=True, capture_output=True, timeout=30)
        except (OSError, subprocess.CalledProcessError) as exc:
            pytest.skip(f"cannot mount a tmpfs here: {exc}")
        vol = Volume(path, size)
        mounted.append(vol)
        return vol

    yield make
    for vol in mounted:
        subprocess.run(["umount", "-l", str(vol.path)], capture_output=True, timeout=30)


# -- checkpoints --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def policy(tiny_test_model: Path):
    import torch

    from mcprl_trainer.config import LoraSettings, TrainConfig
    from mcprl_trainer.grpo import GRPOUpdater
    from mcprl_trainer.modeling import load_policy, load_tokenizer

    torch.set_num_threads(1)
    train = TrainConfig(device="cpu")
    model = load_policy(str(tiny_test_model), LoraSettings(), train)
    updater = GRPOUpdater(model, train, load_tokenizer(str(tiny_test_model)).pad_token_id)
    return model, updater


def _assert_loadable(run_dir: Path, step: int, tiny_test_model: Path) -> None:
    from mcprl_trainer.checkpoint import latest_checkpoint, list_checkpoints, load_trainer_state
    from mcprl_trainer.config import LoraSettings, TrainConfig
    from mcprl_trainer.modeling import load_policy

    latest = latest_checkpoint(run_dir)
    assert latest is not None and latest.step == step
    assert [c.step for c in list_checkpoints(run_dir)] == list(range(1, step + 1))
    assert latest.state()["step"] == step
    assert "rng" in load_trainer_state(latest)
    load_policy(str(tiny_test_model), LoraSettings(), TrainConfig(device="cpu"),
                adapter_path=latest.path)
    leftovers = [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith(".")]
    assert leftovers == []


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_checkpoint_fault_keeps_the_previous_one(volume, policy, tiny_test_model, fault) -> None:
    from mcprl_trainer.checkpoint import CheckpointWriteError, save_checkpoint

    model, updater = policy
    vol = volume("ckpt", "8m")
    run_dir = vol.path / "run"
    save_checkpoint(run_dir, 1, model, updater.state_dict(), {"history": [{"step": 1}]})
    vol.fill() if fault == "full" else vol.read_only()
    for step in (2, 1):  # a new step, and re-saving the same step (after its eval)
        with pytest.raises(CheckpointWriteError) as info:
            save_checkpoint(run_dir, step, model, updater.state_dict(), {"history": []})
        message = info.value.strerror
        reason = "No space left on device" if fault == "full" else "Read-only file system"
        assert f"cannot write checkpoint step-{step}" in message and reason in message
        assert "latest complete checkpoint is step-1" in message
        _assert_loadable(run_dir, 1, tiny_test_model)
    vol.free() if fault == "full" else vol.read_only(False)
    save_checkpoint(run_dir, 2, model, updater.state_dict(), {"history": []})
    _assert_loadable(run_dir, 2, tiny_test_model)


def test_crash_between_the_renames_of_a_resave_loses_no_step(tmp_path, policy,
                                                             tiny_test_model) -> None:
    from mcprl_trainer.checkpoint import clean_temporaries, save_checkpoint

    model, updater = policy
    run_dir = tmp_path / "run"
    for step in (1, 2):
        save_checkpoint(run_dir, step, model, updater.state_dict(), {"history": []})
    root = run_dir / "checkpoints"
    os.rename(root / "step-2", root / ".old-step-2-123")  # what a kill mid re-save leaves
    (root / ".tmp-step-2-1-2").mkdir()
    clean_temporaries(run_dir)
    _assert_loadable(run_dir, 2, tiny_test_model)


@pytest.mark.integration
def test_run_out_of_disk_stops_clearly_then_resumes(volume, fault_stack, trainer,
                                                    tmp_path) -> None:
    vol = volume("runs", "64m")
    config = fault_stack.run_config(tmp_path, "disk", steps=3, output_dir=str(vol.path))
    run = trainer(config).start()
    step1 = run.run_dir / "checkpoints" / "step-1" / "state.json"
    deadline = time.monotonic() + 120
    while not step1.exists():
        assert run.proc.poll() is None and time.monotonic() < deadline, run.tail()
        time.sleep(0.01)
    vol.fill()
    assert run.wait() == 1, run.tail()
    log = run.tail(1_000_000)
    assert "mcprl-train: cannot write" in log and "No space left on device" in log
    assert "the latest complete checkpoint is step-" in log
    assert "Traceback" not in log
    for name in ("metrics.jsonl", "config.yaml"):  # what the run wrote is whole or absent
        path = run.run_dir / name
        if path.exists() and name.endswith(".jsonl"):
            assert all(json.loads(x) for x in path.read_text().splitlines())
    vol.free()
    run.start("--resume")
    assert run.wait() == 0, run.tail()
    assert [h["step"] for h in run.rows("metrics.jsonl")] == [1, 2, 3]


# -- scenario sets ------------------------------------------------------------------------------
def _files_are_whole(root: Path) -> None:
    for path in root.rglob("*"):
        assert not path.name.endswith(".tmp"), path
        if path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".jsonl":
            for line in path.read_text().splitlines():
                json.loads(line)


def test_scenario_set_writes_on_a_full_or_read_only_volume(volume, tmp_path) -> None:
    from mcprl_mcp_server.loopback import serve_mcp
    from mcprl_scenario_gen.app import create_app
    from mcprl_scenario_gen.settings import ScenarioGenSettings
    from mcprl_testing.scenario_gen import wait_finished

    vol = volume("sets", "4m")
    with serve_mcp(tmp_path / "mcp") as (mcp_url, _), UvicornThread(create_app(ScenarioGenSettings(
            data_dir=vol.path, checkpoint_every_s=0.0))) as server, \
            httpx.Client(base_url=server.url, timeout=30) as client:
        request = {"mcp_url": mcp_url, "strategy": "sql", "n": 24, "seed": 0}
        first = client.post("/v1/scenario-sets", json=request).json()["id"]
        assert wait_finished(client, first)["status"] == "succeeded"

        vol.read_only()
        resp = client.post("/v1/scenario-sets", json=request)
        assert resp.status_code == 507, resp.text
        assert "Read-only file system" in resp.json()["error"]["message"]
        assert client.get(f"/v1/scenario-sets/{first}/scenarios").json()["count"] > 0
        assert client.get("/healthz").status_code == 503  # data dir not writable
        vol.read_only(False)

        second = client.post("/v1/scenario-sets", json=request)
        assert second.status_code == 202
        vol.fill()  # the generation runs on; its checkpoint and final writes fail
        status = wait_finished(client, second.json()["id"])
        assert status["status"] == "failed" and status["error"].startswith("storage:"), status
        assert "No space left on device" in status["error"]
        assert client.get(f"/v1/scenario-sets/{first}/scenarios").json()["count"] > 0
        vol.free()
        _files_are_whole(vol.path)
        third = client.post("/v1/scenario-sets", json=request).json()["id"]
        assert wait_finished(client, third)["status"] == "succeeded"


# -- the judge cache ----------------------------------------------------------------------------
def _group(task: str) -> dict:
    from mcprl_judge.routes import SCORE_GROUP_EXAMPLES

    body = json.loads(json.dumps(SCORE_GROUP_EXAMPLES["ruler"]["value"]))
    body["scenario"]["task"] = task
    return body


def _cache_failures(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines()
               if x.startswith("mcprl_judge_failures_total") and 'kind="cache"' in x)


def test_judge_cache_on_a_full_or_read_only_volume(volume, caplog) -> None:
    from mcprl_judge.loopback import serve_judge
    from mcprl_judge.settings import JudgeSettings
    from mcprl_testing.judge import instant_provider

    vol = volume("cache", "2m")
    with instant_provider() as upstream:
        settings = JudgeSettings(base_url=upstream, model="judge", structured_output="json_schema",
                                 cache_path=vol.path / "cache.sqlite3")
        with serve_judge(settings) as url:
            first = httpx.post(f"{url}/v1/score-group", json=_group("one"), timeout=30).json()
            vol.fill()
            resp = httpx.post(f"{url}/v1/score-group", json=_group("two"), timeout=30)
            assert resp.status_code == 200, resp.text  # scored, just not cached
            assert _cache_failures(url) >= 1
            assert any("cache write failed" in r.getMessage() for r in caplog.records)
            again = httpx.post(f"{url}/v1/score-group", json=_group("one"), timeout=30).json()
            assert again["cached"] is True and again["scores"] == first["scores"]
            vol.free()
        vol.read_only()  # a judge started on a read-only cache volume scores uncached
        with serve_judge(settings.model_copy(update={
                "cache_path": vol.path / "new" / "cache.sqlite3"})) as url:
            health = httpx.get(f"{url}/healthz", timeout=5).json()
            assert health["cache_enabled"] is False and "Read-only" in health["cache_error"]
            resp = httpx.post(f"{url}/v1/score-group", json=_group("three"), timeout=30)
            assert resp.status_code == 200


WRITER = """
import sys, time
from pathlib import Path
from mcprl_judge.cache import JudgementCache
from mcprl_judge.judge_output import JudgeAnswer, Judgement
cache = JudgementCache(Path(sys.argv[1]))
answer = JudgeAnswer(judgements=[Judgement(explanation="x" * 2000, score=0.5)] * 8)
for i in range(1_000_000):
    cache._put(f"key-{i}", "m", answer)
    print(i, flush=True)
"""


def test_judge_cache_survives_sigkill_during_writes(tmp_path: Path) -> None:
    from mcprl_judge.cache import JudgementCache

    path = tmp_path / "cache.sqlite3"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE,
                            text=True)
    acknowledged = -1
    assert proc.stdout is not None
    for line in proc.stdout:  # kill it mid-stream, between or inside transactions
        acknowledged = int(line)
        if acknowledged >= 300:
            os.kill(proc.pid, signal.SIGKILL)
            break
    proc.wait(30)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    cache = JudgementCache(path)
    try:
        for i in range(acknowledged + 1):  # every write it reported as done is there, whole
            hit = asyncio.run(cache.get(f"key-{i}"))
            assert hit is not None and len(hit.judgements) == 8, i
        assert cache.count() >= acknowledged + 1
    finally:
        cache.close()
