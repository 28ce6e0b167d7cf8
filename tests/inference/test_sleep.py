"""Sleep mode as vLLM's dev-mode endpoints: requests while asleep get 503, wake restores."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

PROMPT = [5, 6, 7, 8, 9, 10]


@pytest.fixture(scope="module")
def sleepy(tiny_test_model: Path, serve_factory):
    with serve_factory(tiny_test_model) as srv:
        yield srv


def _greedy(srv) -> list[int]:
    r = srv.client.completions.create(model=srv.model, prompt=PROMPT, max_tokens=6,
                                      temperature=0.0,
                                      extra_body={"return_token_ids": True, "ignore_eos": True})
    return r.choices[0].model_extra["token_ids"]


@pytest.mark.timeout(60)
def test_sleep_and_wake(sleepy) -> None:
    before = _greedy(sleepy)
    assert sleepy.http.get("/is_sleeping").json() == {"is_sleeping": False}
    assert sleepy.http.post("/sleep", params={"level": 1}).status_code == 200
    assert sleepy.http.get("/is_sleeping").json() == {"is_sleeping": True}
    with pytest.raises(openai.APIStatusError) as err:
        _greedy(sleepy)
    assert err.value.status_code == 503 and "wake_up" in err.value.message
    health = sleepy.http.get("/healthz").json()
    assert health["sleeping"] is True
    assert sleepy.metric("mcprl_inference_sleeping") == 1.0
    assert sleepy.http.post("/wake_up").status_code == 200
    assert sleepy.http.get("/is_sleeping").json() == {"is_sleeping": False}
    assert _greedy(sleepy) == before
    assert sleepy.http.post("/sleep", params={"level": 7}).status_code == 400
