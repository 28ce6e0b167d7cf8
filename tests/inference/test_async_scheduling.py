"""Async scheduling (``EngineConfig.async_scheduling``): a decode step launched before the host
read the one before must change nothing a caller sees.

On the CPU nothing runs asynchronously, but the scheduling is the same code (on a GPU,
where it is the default, the same tests run with the copies in flight): steps run
ahead, sequences stop while the next step already holds their row (which is dropped), and
queued requests join the batch once the step in flight is taken. Every output must equal
the engine's without it, token for token and log-prob for log-prob, and a plain forward pass.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mcprl_inference.engine import EngineConfig, LLMEngine, SamplingParams


def _engine(model: Path, async_scheduling: bool) -> LLMEngine:
    # float32 on a GPU too: the log-probs are checked against a float32 forward pass
    return LLMEngine.from_pretrained(str(model), EngineConfig(
        max_batch_size=6, max_model_len=256, dtype="float32",
        async_scheduling=async_scheduling)).start()


def _run(engine: LLMEngine, stops: dict[int, int]) -> list:
    prompts = [[(5 * i + 3 * j) % 900 + 20 for j in range(4 + 2 * i)] for i in range(14)]
    futures = [engine.add_request(p, SamplingParams(
        n=2 if i % 5 == 0 else 1, max_tokens=5 + 3 * (i % 4), seed=i, temperature=1.0,
        ignore_eos=True, stop_token_ids=[stops[i]] if i in stops else []))
        for i, p in enumerate(prompts)]
    return [(p, f.result(120)) for p, f in zip(prompts, futures, strict=True)]


@pytest.mark.timeout(300)
def test_outputs_equal_the_synchronous_engine_and_a_forward_pass(tiny_test_model: Path,
                                                                  ref_logprobs) -> None:
    sync = _engine(tiny_test_model, False)
    try:
        free = _run(sync, {})
        # half the requests stop at their third sampled token: mid-batch, mid-step
        stops = {i: out.outputs[0].token_ids[2] for i, (_, out) in enumerate(free) if i % 2}
        want = _run(sync, stops)
        assert sync.stats.ahead_steps == 0
    finally:
        sync.shutdown()
    ahead = _engine(tiny_test_model, True)
    try:
        got = _run(ahead, stops)
        stats = ahead.stats
    finally:
        ahead.shutdown()
    assert stats.ahead_steps > 0 and stats.dropped_rows > 0  # both paths ran
    assert any(o.finish_reason == "stop" for _, out in got for o in out.outputs)
    for (prompt, out), (_, ref) in zip(got, want, strict=True):
        assert [o.token_ids for o in out.outputs] == [o.token_ids for o in ref.outputs]
        assert [o.finish_reason for o in out.outputs] == [o.finish_reason for o in ref.outputs]
        for o, r in zip(out.outputs, ref.outputs, strict=True):
            assert o.logprobs == pytest.approx(r.logprobs, abs=1e-5)  # batch shapes differ
            assert o.logprobs == pytest.approx(ref_logprobs(prompt, o.token_ids), abs=1e-4)


@pytest.mark.timeout(120)
def test_an_abort_while_a_step_is_in_flight(tiny_test_model: Path) -> None:
    """The step in flight is taken before the batch changes: the aborted request ends, the
    others finish with all their tokens."""

    engine = _engine(tiny_test_model, True)
    try:
        params = SamplingParams(max_tokens=40, seed=1, ignore_eos=True)
        keep = [engine.add_request([30 + i] * 6, params) for i in range(3)]
        gone = engine.add_request([99] * 6, params, request_id="gone")
        while engine.stats.ahead_steps < 3:
            pass
        engine.abort("gone")
        outs = [f.result(60) for f in keep]
        assert gone.cancelled()
        assert all(len(o.outputs[0].token_ids) == 40 for o in outs)
    finally:
        engine.shutdown()
