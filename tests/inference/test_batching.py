"""Concurrent HTTP requests are decoded together (a batch > 1 shows in the metrics) and each
gets the tokens it would have got alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest


@pytest.mark.timeout(120)
def test_concurrent_requests_share_decode_steps(server) -> None:
    prompts = [[20 + i, 30 + 2 * i, 40 + 3 * i, 7] for i in range(8)]

    def ask(prompt: list[int]) -> list[int]:
        r = server.client.completions.create(
            model=server.model, prompt=prompt, max_tokens=48, temperature=0.0,
            extra_body={"return_token_ids": True, "ignore_eos": True})
        return r.choices[0].model_extra["token_ids"]

    steps_before = server.metric("mcprl_inference_decode_batch_size_count")
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, prompts))
    steps = server.metric("mcprl_inference_decode_batch_size_count") - steps_before
    assert server.metric("mcprl_inference_decode_batch_size_max") > 1
    assert steps < 8 * 47, "requests were decoded one at a time"
    alone = [ask(p) for p in prompts]
    assert together == alone
    assert server.metric("vllm:generation_tokens_total") >= 2 * 8 * 48
    assert server.metric("vllm:e2e_request_latency_seconds_count") >= 16
    assert server.metric("vllm:num_requests_running") == 0
