"""``scheduler_delay_factor`` (vLLM's ``--scheduler-delay-factor``): requests that reach a
decoding engine one by one wait and prefill together, instead of one prefill each; an idle
engine still admits at once, and every request gets the tokens it gets alone."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mcprl_inference.engine import EngineConfig, LLMEngine, RequestOutput, SamplingParams

pytestmark = pytest.mark.timeout(180)


def _params(seed: int, max_tokens: int = 6) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, seed=seed, ignore_eos=True, temperature=1.0)


def _until(done: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Poll the engine thread's progress (a condition, not a fixed wait)."""

    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "the engine made no progress"
        time.sleep(0.0005)


def _trickle(model: Path, factor: float) -> tuple[list[RequestOutput], int]:
    """A long request, then three short ones, each sent once the engine has decoded two
    more steps (it has seen the one before): the outputs and the prefill batches."""

    eng = LLMEngine.from_pretrained(str(model), EngineConfig(
        max_batch_size=8, max_model_len=256, scheduler_delay_factor=factor))
    eng.start()
    try:
        futures = [eng.add_request([5, 6, 7, 8], _params(0, max_tokens=96))]
        for i in range(3):
            steps = eng.stats.decode_steps
            _until(lambda steps=steps: eng.stats.decode_steps >= steps + 2)
            futures.append(eng.add_request([20 + i, 30, 40], _params(i + 1)))
        outs = [f.result(60) for f in futures]
        return outs, eng.stats.prefill_batches
    finally:
        eng.shutdown()


def test_requests_sent_while_a_batch_decodes_prefill_together(tiny_test_model: Path) -> None:
    eager, eager_batches = _trickle(tiny_test_model, 0.0)
    held, held_batches = _trickle(tiny_test_model, 1e6)
    assert eager_batches == 4  # each short request joined the batch at the next step
    # held until the long one finished (a factor this large never lets them in while it
    # decodes), then admitted at once by the idle engine: one prefill for the three
    assert held_batches == 2
    assert all(h.outputs[0].token_ids == e.outputs[0].token_ids
               for h, e in zip(held, eager, strict=True))
    assert all(h.outputs[0].logprobs == pytest.approx(e.outputs[0].logprobs, abs=1e-5)
               for h, e in zip(held, eager, strict=True))


def test_the_service_setting_reaches_the_engine() -> None:
    from mcprl_inference.settings import InferenceSettings

    assert InferenceSettings(scheduler_delay_factor=0.5).engine_config() \
        .scheduler_delay_factor == 0.5
    with pytest.raises(ValueError, match="scheduler_delay_factor"):
        InferenceSettings(scheduler_delay_factor=-1)
