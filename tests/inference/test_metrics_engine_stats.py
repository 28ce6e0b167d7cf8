"""The engine's own counters (prefill/decode time and counts, CUDA-graph captures) show in
/metrics and move with a real request: what the RL-step benchmark reads to split its rollout
phase into prefill, decode and everything else."""

from __future__ import annotations

import pytest

ENGINE_COUNTERS = (
    "mcprl_inference_prefill_seconds_total", "mcprl_inference_prefill_batches_total",
    "mcprl_inference_prefill_forwards_total",
    "mcprl_inference_decode_seconds_total", "mcprl_inference_decode_steps_total",
    "mcprl_inference_decode_tokens_total", "mcprl_inference_cuda_graph_captures_total",
    "mcprl_inference_decode_forward_seconds_total", "mcprl_inference_sample_seconds_total",
)


@pytest.mark.timeout(120)
def test_engine_counters_move_with_a_request(server) -> None:
    before = {name: server.metric(name) for name in ENGINE_COUNTERS}
    generated_before = server.metric("vllm:generation_tokens_total")
    requests, max_tokens = 3, 12
    for i in range(requests):
        r = server.client.completions.create(
            model=server.model, prompt=[20 + i, 30, 40, 7], max_tokens=max_tokens,
            temperature=0.0, extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == max_tokens
    delta = {name: server.metric(name) - before[name] for name in ENGINE_COUNTERS}
    generated = server.metric("vllm:generation_tokens_total") - generated_before
    assert generated == requests * max_tokens
    assert delta["mcprl_inference_prefill_batches_total"] >= 1
    assert delta["mcprl_inference_prefill_forwards_total"] >= 1
    assert delta["mcprl_inference_prefill_seconds_total"] > 0
    assert delta["mcprl_inference_decode_steps_total"] > 0
    assert delta["mcprl_inference_decode_seconds_total"] > 0
    # a request's first token comes from its prefill, every other one from a decode step
    assert delta["mcprl_inference_decode_tokens_total"] == generated - requests
    assert (delta["mcprl_inference_decode_steps_total"]
            <= delta["mcprl_inference_decode_tokens_total"])
    # CPU: no CUDA graphs, and the profile's device times stay 0
    assert delta["mcprl_inference_cuda_graph_captures_total"] == 0
    assert delta["mcprl_inference_decode_forward_seconds_total"] == 0
    assert delta["mcprl_inference_sample_seconds_total"] == 0


def test_profile_setting_reaches_the_engine_config() -> None:
    from mcprl_inference.settings import InferenceSettings

    assert InferenceSettings().engine_config().profile is False
    assert InferenceSettings(profile=True).engine_config().profile is True
