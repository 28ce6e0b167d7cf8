"""Rollouts overlapped with the update (``train.max_staleness = 1``) on the real stack: the
engine behind a recording pass-through proxy, so what the trainer trained on is compared
with what the engine really answered, and with which adapter it was serving at the time."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mcprl_common.process import UvicornThread
from mcprl_common.wire import Scenario, Trajectory
from mcprl_testing.recording_proxy import Exchange, Recording, recording_proxy
from mcprl_trainer.config import RunConfig
from mcprl_trainer.groups import GroupBatch, ScoredGroup
from mcprl_trainer.grpo import TrainSample
from mcprl_trainer.overlap import CollectedBatch, Prefetch, sample_version, staleness
from mcprl_trainer.records import RolloutResult, TokenRecord, TurnRecord
from mcprl_trainer.trainer import RunOutcome, Trainer

pytestmark = pytest.mark.timeout(300)
STEPS = 3


# -- the bookkeeping, on its own -------------------------------------------------------------
def _result(*versions: int | None) -> RolloutResult:
    turns = [TurnRecord(0, [1], [-0.5], "stop", "m", policy_version=v) for v in versions]
    trajectory = Trajectory(messages=[{"role": "user", "content": "t"}])
    return RolloutResult(Scenario(id="s", task="t"), trajectory, TokenRecord([0], turns), 0.1)


def test_a_batch_is_as_old_as_its_oldest_turn() -> None:
    group = ScoredGroup(Scenario(id="s", task="t"), [_result(3, 3), _result(3, 2)])
    collected = CollectedBatch(4, 3, "m", GroupBatch([group]))
    assert collected.version == 2 and staleness(4, collected) == 2
    untracked = CollectedBatch(4, 3, "m", GroupBatch([ScoredGroup(group.scenario,
                                                                  [_result(None)])]))
    assert untracked.version == 3  # the version served when it started


def test_the_version_a_batch_is_sampled_from_when_nothing_was_prefetched() -> None:
    assert sample_version(3, 0, {0, 1, 2, 3}) == 3  # synchronous: on-policy
    assert sample_version(3, 1, {0, 1, 2, 3}) == 2  # resumed overlapped run: the schedule's
    assert sample_version(3, 1, {0, 3}) == 3  # its adapter pruned: on-policy instead
    assert sample_version(0, 1, {0}) == 0


async def test_cancel_stops_a_collection_in_flight_and_waits_for_it() -> None:
    closed = asyncio.Event()

    async def collect() -> CollectedBatch:
        try:
            await asyncio.sleep(60)
        finally:
            closed.set()  # what closing the MCP sessions and HTTP requests stands for
        raise AssertionError("not cancelled")

    prefetch = Prefetch()
    prefetch.start(2, collect())
    await asyncio.sleep(0)
    assert prefetch.holds(2) and not prefetch.holds(3)
    await prefetch.cancel()
    assert closed.is_set() and not prefetch.holds(2)
    await prefetch.cancel()  # nothing left: a no-op


# -- the real stack ----------------------------------------------------------------------------
def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class UpdateSpy:
    """Wraps the trainer group's real ``step``: keeps each update's samples and times."""

    def __init__(self, trainer: Trainer, on_call: Callable[[int], None] | None = None) -> None:
        self.real = trainer.group.step
        self.on_call = on_call
        self.calls: list[tuple[list[TrainSample], float, float]] = []
        trainer.group.step = self  # type: ignore[method-assign]

    def __call__(self, samples: list[TrainSample]) -> dict[str, float]:
        if self.on_call is not None:
            self.on_call(len(self.calls) + 1)
        started = time.monotonic()
        out = self.real(samples)
        self.calls.append((list(samples), started, time.monotonic()))
        return out


@dataclass
class Run:
    config: RunConfig
    outcome: RunOutcome
    spy: UpdateSpy
    recording: Recording
    base_model: str


def _config(stack, tmp_path: Path, engine_url: str, name: str, **over: Any) -> RunConfig:
    return RunConfig.model_validate(stack.run_config(
        tmp_path, name=name, steps=STEPS, policy={"base_url": engine_url},
        train={"lr": 1e-3, "device": "cpu", "max_staleness": 1,
               "skip_zero_variance": False},  # every rollout trained on, and so checked
        **over))


@pytest.fixture(scope="module")
def proxy(stack) -> Iterator[tuple[str, Recording]]:
    app, recording = recording_proxy(stack.engine_url.removesuffix("/v1"))
    with UvicornThread(app) as server:
        yield f"{server.url}/v1", recording


@pytest.fixture(scope="module")
def overlapped(stack, proxy, tmp_path_factory) -> Run:
    """One uninterrupted overlapped run of three steps, evals after steps 0, 2 and 3."""

    url, recording = proxy
    recording.exchanges.clear()
    config = _config(stack, tmp_path_factory.mktemp("overlap"), url, "overlap",
                     eval={"every": 2})
    trainer = Trainer(config)
    spy = UpdateSpy(trainer)
    outcome = asyncio.run(trainer.run())
    return Run(config, outcome, spy, recording, stack.base_model)


def _segments(mask: list[int]) -> list[tuple[int, int]]:
    """The runs of sampled ids (mask 1) of a sample: one per turn."""

    out, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    return out


def _version_of(path: str) -> int:
    """A loaded adapter's version: checkpoints/step-N, or v<N> of the publish dir."""

    found = re.search(r"(?:step-|/v)(\d+)$", path.rstrip("/"))
    assert found, path
    return int(found.group(1))


def _served_version(run: Run, call: Exchange) -> int:
    """Which policy the engine served for ``call``: by the adapter loads the proxy saw."""

    if call.request["model"] == run.base_model:
        return 0
    loads = [e for e in run.recording.of("/load_lora_adapter")
             if e.request["lora_name"] == call.request["model"]]
    assert not [e for e in loads if e.started < call.ended and e.ended > call.started], \
        "an adapter was loaded while a completion was sampled"
    before = [e for e in loads if e.ended <= call.started]
    return _version_of(max(before, key=lambda e: e.ended).request["lora_path"])


def _logprobs(call: Exchange) -> list[float]:
    lps = call.response["choices"][0]["logprobs"]["token_logprobs"]
    return [0.0 if x is None else float(x) for x in lps]


@pytest.mark.integration
def test_overlapped_steps_train_on_exactly_what_the_engine_sampled(overlapped: Run) -> None:
    run = overlapped
    assert run.outcome.steps_done == STEPS and not run.outcome.stopped_early
    assert len(run.spy.calls) == STEPS
    completions = run.recording.of("/completions")
    by_prompt: dict[tuple[int, ...], list[Exchange]] = defaultdict(list)
    for call in completions:
        by_prompt[tuple(call.request["prompt"])].append(call)

    oldest: list[int] = []
    for step, (samples, _, _) in enumerate(run.spy.calls, start=1):
        assert samples, f"step {step} trained on nothing"
        versions = set()
        for sample in samples:
            segments = _segments(sample.mask)
            assert segments
            for a, b in segments:
                # The engine was sent exactly the ids before the turn, and answered exactly
                # the ids and log-probs trained on.
                sent = by_prompt[tuple(sample.input_ids[:a])]
                same = [c for c in sent if c.response["choices"][0]["token_ids"]
                        == sample.input_ids[a:b] and _logprobs(c) == sample.sampler_logprobs[a:b]]
                assert same, f"step {step}: a trained turn the engine never returned"
                served = {_served_version(run, c) for c in same}
                assert len(served) == 1
                versions |= served
        oldest.append(min(versions))
        # One sampled version per batch: no rollout straddles a publish.
        assert len(versions) == 1, (step, versions)
    # Step N trains the weights of version N-1 on rollouts of version max(N-2, 0).
    staleness = [step - 1 - v for step, v in enumerate(oldest, start=1)]
    assert staleness == [0, 1, 1]
    assert all(s <= run.config.train.max_staleness for s in staleness)

    # The run's own records say the same.
    history = _rows(run.config.run_dir / "metrics.jsonl")
    assert [h["staleness"] for h in history] == staleness
    assert [h["policy_version"] for h in history] == oldest
    assert all(h["rollout_wait_seconds"] >= 0 and 0 <= h["update_idle_share"] <= 1
               for h in history)
    for step, version in enumerate(oldest, start=1):
        rows = _rows(run.config.run_dir / "rollouts" / f"step-{step}.jsonl")
        assert {r["policy_version"] for r in rows} == {version}

    # The next step's rollouts were sampled while the first update ran.
    _, t0, t1 = run.spy.calls[0]
    assert any(c.started < t1 and c.ended > t0 for c in completions)

    # Each eval sampled (greedily) the adapter of its step: the overlap waited for it.
    evals = [c for c in completions if c.request["temperature"] == 0]
    assert {_served_version(run, c) for c in evals} == {0, 2, 3}
    assert [e["step"] for e in _rows(run.config.run_dir / "evals.jsonl")] == [0, 2, 3]


@pytest.mark.integration
def test_stop_cancels_the_prefetched_rollouts_and_resume_follows_the_schedule(
        stack, proxy, overlapped: Run, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url, recording = proxy
    config = _config(stack, tmp_path, url, "overlap-stop")
    stop = threading.Event()

    def sigterm(call: int) -> None:
        # SIGTERM's effect while step 1 trains; the engine is slow from now on, so step 2's
        # rollouts are surely still in flight when the update is done.
        recording.hold.set()
        stop.set()

    async def stopped_run() -> tuple[RunOutcome, list[str]]:
        trainer = Trainer(config, stop=stop)
        UpdateSpy(trainer, on_call=sigterm)
        outcome = await trainer.run()
        left = [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("rollouts")]
        return outcome, left

    try:
        with caplog.at_level("INFO", logger="mcprl_trainer.overlap"):
            outcome, left = asyncio.run(stopped_run())
    finally:
        recording.hold.clear()
    run = config.run_dir
    assert outcome.stopped_early and outcome.steps_done == 1
    assert recording.held > 0  # step 2's rollouts were waiting for the engine
    assert "cancelling the prefetched rollouts" in caplog.text
    assert left == []  # the prefetch was cancelled and awaited
    assert not (run / "rollouts" / "step-2.jsonl").exists()  # never trained on, nor kept
    assert [h["step"] for h in _rows(run / "metrics.jsonl")] == [1]

    resumed = asyncio.run(Trainer(config, resume=True).run())
    assert resumed.steps_done == STEPS and not resumed.stopped_early
    history = _rows(run / "metrics.jsonl")
    assert [h["step"] for h in history] == [1, 2, 3]
    # The resumed step 2 samples what the uninterrupted run's did (version 0), so the run
    # goes on as if it had never stopped.
    assert [h["policy_version"] for h in history] == [0, 0, 1]
    assert [h["staleness"] for h in history] == [0, 1, 1]
    for step in (2, 3):
        ours = _rows(run / "rollouts" / f"step-{step}.jsonl")
        theirs = _rows(overlapped.config.run_dir / "rollouts" / f"step-{step}.jsonl")
        assert [r["trajectory"]["messages"] for r in ours] == \
            [r["trajectory"]["messages"] for r in theirs], f"step {step}"
